package review

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/served"
)

// fixedName is a names.NameGenerator with a known suffix.
type fixedName string

func (f fixedName) GenerateName(base string) string { return base + string(f) }

// declaredWebhooks is what `kadmit review --policies dir [--state
// stateDir]` runs: the built-in webhooks of the seed profile and the
// declared policies of dir, both over the state's caches when stateDir is
// set (the namespaces through celpolicy.Caches and Options.WithCluster).
func declaredWebhooks(t *testing.T, dir, stateDir string) []*admission.Webhook {
	t.Helper()
	src := served.Sources{Config: builtin.Config.Default(), Declared: &served.Declared{Paths: []string{dir}}}
	if stateDir != "" {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		src.Cluster = func(caches []clustercache.Read) (*clustercache.Caches, error) {
			return LoadState(ctx, stateDir, caches)
		}
	}
	return assembled(t, src)
}

// assembled is what the command serves from src (served.Assemble).
func assembled(t *testing.T, src served.Sources) []*admission.Webhook {
	t.Helper()
	p, err := served.Assemble(src)
	if err != nil {
		t.Fatal(err)
	}
	whs, err := p.Webhooks()
	if err != nil {
		t.Fatal(err)
	}
	return whs
}

func reviewWith(t *testing.T, whs []*admission.Webhook, manifest string, opts Options) *Result {
	t.Helper()
	docs, err := Read("-", strings.NewReader(manifest))
	if err != nil || len(docs) != 1 {
		t.Fatalf("Read: %v, %d docs", err, len(docs))
	}
	res, err := Run(context.Background(), whs, docs[0], opts)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// The suite's policies of internal/policysuite: a MutatingAdmissionPolicy that
// records the name it saw in an annotation, and a ValidatingAdmission-
// Policy reading object.metadata.name and request.name.
const generateNamePolicies = "../policysuite/testdata/generatename"

const generateNamePod = `apiVersion: v1
kind: Pod
metadata: {generateName: web-, namespace: default}
spec: {containers: [{name: c, image: nginx}]}
`

// TestRunGenerateName: a generateName pod reaches the mutating webhooks
// (built-in and declared) unnamed and the validating ones named, as on the
// API server; the result carries the name. Without the name the
// validation's object.metadata.name fails ("no such key: name").
func TestRunGenerateName(t *testing.T) {
	whs := declaredWebhooks(t, generateNamePolicies, "")
	res := reviewWith(t, whs, generateNamePod, Options{NameGenerator: fixedName("abcde")})
	if !res.Allowed || res.Name != "web-abcde" {
		t.Fatalf("result %+v (%s)", res, res.Object)
	}
	if !slices.Contains(res.Webhooks, celpolicy.ValidatePath) || !slices.Contains(res.Webhooks, celpolicy.MutatePath) {
		t.Fatalf("webhooks %v: the declared policies did not run", res.Webhooks)
	}
	var obj struct {
		Metadata struct {
			Name        string            `json:"name"`
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(res.Object, &obj); err != nil {
		t.Fatal(err)
	}
	if obj.Metadata.Name != "web-abcde" || obj.Metadata.Annotations["saw-name"] != "none,none" {
		t.Fatalf("object %s: want the name web-abcde, and none seen by the mutating policy", res.Object)
	}
	for _, op := range res.Patch {
		if op.Path == "/metadata/name" {
			t.Errorf("the patch sets the name: %+v; it holds the webhooks' operations only", op)
		}
	}

	// The validating webhooks are asked about the generated name: the
	// denial names it.
	res = reviewWith(t, whs, strings.Replace(generateNamePod, "web-", "blocked-", 1), Options{NameGenerator: fixedName("abcde")})
	if res.Allowed || res.Name != "blocked-abcde" || res.Message != "ValidatingAdmissionPolicy 'name-length' with binding 'name-length' denied request: name blocked-abcde is blocked" {
		t.Fatalf("blocked: %+v", res)
	}

	// The API server's generator by default: random.
	res = reviewWith(t, whs, generateNamePod, Options{})
	if !res.Allowed || !strings.HasPrefix(res.Name, "web-") || len(res.Name) != len("web-")+5 {
		t.Fatalf("default generator: %+v", res)
	}

	// Not on UPDATE: the object is the stored one, named.
	docs, _ := Read("-", strings.NewReader(strings.Replace(generateNamePod, "{generateName: web-,", "{name: web-1, generateName: web-,", 1)))
	res, err := Run(context.Background(), whs, docs[0], Options{Operation: "UPDATE", Old: docs, NameGenerator: fixedName("abcde")})
	if err != nil || !res.Allowed || res.Name != "web-1" {
		t.Fatalf("update: %v %+v", err, res)
	}
}

// TestRunUserInfo: --user, --group and --uid are the request's userInfo
// for declared policies; without them the user is DefaultUser, no groups.
func TestRunUserInfo(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "policy.yaml", `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: devs-only}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}]
  validations:
  - expression: "'dev' in request.userInfo.?groups.orValue([])"
    messageExpression: "'user ' + request.userInfo.username + ' (uid ' + request.userInfo.?uid.orValue('none') + ') is not in group dev'"
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: devs-only}
spec: {policyName: devs-only, validationActions: [Deny]}
`)
	whs := declaredWebhooks(t, dir, "")
	const cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: default}\n"
	if res := reviewWith(t, whs, cm, Options{}); res.Allowed || !strings.HasSuffix(res.Message, "user kadmit-review (uid none) is not in group dev") {
		t.Fatalf("default user: %+v", res)
	}
	if res := reviewWith(t, whs, cm, Options{UserInfo: authenticationv1.UserInfo{Username: "alice", UID: "u-1", Groups: []string{"ops"}}}); res.Allowed || !strings.HasSuffix(res.Message, "user alice (uid u-1) is not in group dev") {
		t.Fatalf("alice in ops: %+v", res)
	}
	if res := reviewWith(t, whs, cm, Options{UserInfo: authenticationv1.UserInfo{Username: "alice", Groups: []string{"ops", "dev"}}}); !res.Allowed {
		t.Fatalf("alice in dev: %+v", res)
	}
}

// TestStateNamespacesForDeclaredPolicies: the state's namespaces answer
// the declared policies' namespaceSelector and namespaceObject, as kadmit
// serve's namespace cache does; a namespace the state does not hold has
// only kubernetes.io/metadata.name.
func TestStateNamespacesForDeclaredPolicies(t *testing.T) {
	dir, state := t.TempDir(), t.TempDir()
	write(t, dir, "policy.yaml", `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: prod-replicas}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}]
  validations:
  - expression: "false"
    messageExpression: "'namespace ' + namespaceObject.metadata.name + ' is ' + namespaceObject.metadata.labels[?'env'].orValue('unlabelled')"
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: prod}
spec:
  policyName: prod-replicas
  validationActions: [Deny]
  matchResources: {namespaceSelector: {matchLabels: {env: prod}}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: by-name}
spec:
  policyName: prod-replicas
  validationActions: [Deny]
  matchResources: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: elsewhere}}}
`)
	write(t, state, "ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, labels: {env: prod}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: dev, labels: {env: dev}}\n")
	cm := func(ns string) string {
		return "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: " + ns + "}\n"
	}
	whs := declaredWebhooks(t, dir, state)
	if res := reviewWith(t, whs, cm("shop"), Options{}); res.Allowed || res.Message != "ValidatingAdmissionPolicy 'prod-replicas' with binding 'prod' denied request: namespace shop is prod" {
		t.Fatalf("shop (env=prod in the state): %+v", res)
	}
	if res := reviewWith(t, whs, cm("dev"), Options{}); !res.Allowed {
		t.Fatalf("dev (env=dev in the state): %+v", res)
	}
	// Not in the state: only kubernetes.io/metadata.name.
	if res := reviewWith(t, whs, cm("elsewhere"), Options{}); res.Allowed || res.Message != "ValidatingAdmissionPolicy 'prod-replicas' with binding 'by-name' denied request: namespace elsewhere is unlabelled" {
		t.Fatalf("elsewhere (not in the state): %+v", res)
	}
	// The state's namespaces have that label too, as in a cluster.
	write(t, dir, "by-name.yaml", `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: dev-by-name}
spec:
  policyName: prod-replicas
  validationActions: [Deny]
  matchResources: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: dev}}}
`)
	if res := reviewWith(t, declaredWebhooks(t, dir, state), cm("dev"), Options{}); res.Allowed || !strings.HasSuffix(res.Message, "namespace dev is dev") {
		t.Fatalf("dev by its name label: %+v", res)
	}
	// Without the state every namespace is unlabelled.
	if res := reviewWith(t, declaredWebhooks(t, dir, ""), cm("shop"), Options{}); !res.Allowed {
		t.Fatalf("shop without --state: %+v", res)
	}
}

// TestRunRequestOptions: a reviewed CREATE carries the options object the
// API server passes (CreateOptions, meta.k8s.io/v1) and is not a dry run,
// as `kadmit test` builds it (admission.RequestOptions).
func TestRunRequestOptions(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "policy.yaml", `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: echo}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}]
  validations:
  - expression: "false"
    messageExpression: "'options ' + request.options.kind + ' ' + request.options.apiVersion + ', dryRun ' + string(request.dryRun)"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: echo}
spec: {policyName: echo, validationActions: [Deny]}
`)
	res := reviewWith(t, declaredWebhooks(t, dir, ""), "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: default}\n", Options{})
	if res.Allowed || !strings.HasSuffix(res.Message, "options CreateOptions meta.k8s.io/v1, dryRun false") {
		t.Fatalf("got %+v", res)
	}
}
