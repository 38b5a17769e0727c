package builtin

import (
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/policy"
	"github.com/kadmit/kadmit/internal/policy/koordinator/elasticquota"
	"github.com/kadmit/kadmit/internal/policy/kueue/jobqueue"
)

const schedulingConfig = `apiVersion: kadmit.io/v1alpha1
kind: Configuration
policies:
  jobQueue: {enabled: true, defaultQueues: {team-a: main}, queues: [{name: main, quota: {cpu: "4"}}]}
  resourceFlavor: {enabled: true}
  elasticQuota: {enabled: true}
  colocation: {enabled: true, profiles: [{name: batch, labels: {qos: be}}]}
  kadmitConfig: {enabled: true, namespace: kadmit-config, name: kadmit}
`

func TestSchedulingHooks(t *testing.T) {
	cfg, err := Config.Parse([]byte(schedulingConfig))
	if err != nil {
		t.Fatal(err)
	}
	hooks, err := Hooks(cfg, policy.Env{})
	if err != nil {
		t.Fatal(err)
	}
	F, I := admissionregistrationv1.Fail, admissionregistrationv1.Ignore
	M, V := admission.Mutating, admission.Validating
	want := []hookKey{
		{"pod-name", "/validate-pod", V, F},
		{"lifespan", "/mutate-pod", M, F},
		{"node-overcommit", "/mutate-node-status", M, I},
		{"node-overcommit", "/validate-node", V, I},
		{"job-queue", "/mutate-batch-v1-job", M, F},
		{"job-queue", "/validate-batch-v1-job", V, F},
		{"resource-flavor", "/mutate-kueue-x-k8s-io-v1beta1-resourceflavor", M, F},
		{"resource-flavor", "/validate-kueue-x-k8s-io-v1beta1-resourceflavor", V, F},
		{"elastic-quota", "/mutate-scheduling-sigs-k8s-io-v1alpha1-elasticquota", M, F},
		{"elastic-quota", "/validate-scheduling-sigs-k8s-io-v1alpha1-elasticquota", V, F},
		{"elastic-quota", "/validate-pod", V, F},
		{"colocation", "/mutate-pod", M, F},
		{"colocation", "/validate-pod", V, F},
		{"kadmit-config", "/validate-configmap", V, F},
	}
	if got := keys(hooks); !slices.Equal(got, want) {
		t.Fatalf("hooks =\n%+v\nwant\n%+v", got, want)
	}
	whs, err := Webhooks(cfg, policy.Env{})
	if err != nil {
		t.Fatal(err)
	}
	for _, wh := range whs {
		if wh.Path == "/validate-pod" && (len(wh.Hooks) != 3 || wh.Hooks[0].Policy != "pod-name") {
			t.Fatalf("/validate-pod hooks %+v", wh.Hooks)
		}
		if wh.Path == "/mutate-pod" && (len(wh.Hooks) != 2 || wh.Hooks[1].Policy != "colocation") {
			t.Fatalf("/mutate-pod hooks %+v", wh.Hooks)
		}
	}
	// job-queue reads LocalQueues, elastic-quota quotas and pods; the
	// colocation profile has no namespaceSelector, so no namespaces.
	if got, want := clustercache.Key(Caches(cfg)), clustercache.Key([]clustercache.Read{
		jobqueue.Definition.Caches(jobqueue.Config{})[0], elasticquota.QuotaFields, elasticquota.PodFields}); got != want {
		t.Fatalf("caches %s, want %s", got, want)
	}
	if got := Caches(Config.Default()); len(got) != 0 {
		t.Fatalf("seed profile reads the cluster: %v", got)
	}
}

func TestSchedulingConfigErrors(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"jobQueue: {defaultQueues: {team-a: \"bad name\"}}", "policies.jobQueue.defaultQueues[team-a]: queue name \"bad name\": a lowercase RFC 1123 subdomain"},
		{"elasticQuota: {rootQuota: x, systemQuota: x}", "policies.elasticQuota.systemQuota: must differ"},
		{"colocation: {profiles: [{name: Bad}]}", "policies.colocation.profiles[0].name"},
		{"kadmitConfig: {enabled: true}", "policies.kadmitConfig.namespace"},
		{"resourceFlavor: {addFinalizers: true}", "unknown field"},
		{"jobQueue: {queues: [{name: main, quota: {cpu: \"1e9999999\"}}]}", "cpu: quantity 1e9999999 is out of range (|value| must be below 9223372036854775807m)"},
	} {
		_, err := Config.Parse([]byte("apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  " + tc.yaml + "\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.yaml, err, tc.want)
		}
	}
}
