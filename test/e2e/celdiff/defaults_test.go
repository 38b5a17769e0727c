package celdiff

import (
	"context"
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/kadmit/kadmit/internal/apidefaults"
	"github.com/kadmit/kadmit/internal/policysuite"
	"github.com/kadmit/kadmit/test/controlplane"
)

// serverPlugins are the apidefaults plugins this package's kube-apiserver
// runs: test/controlplane disables ServiceAccount (it needs the service
// account controller, which does not run here).
var serverPlugins = []string{apidefaults.TaintNodesByCondition, apidefaults.Priority, apidefaults.DefaultTolerationSeconds, apidefaults.StorageObjectInUseProtection}

// checkDefaults requires that kadmit's offline defaults (package
// apidefaults, `kadmit test --defaults`) turn the object as written into
// the object the API server's admission sees with no policy in place
// (r.admitted, a dry run), but for what the server sets after mutating
// admission (uid, timestamps, status: strategy PrepareForCreate) and so
// policies do not see either. CREATE only: an UPDATE's old object is the
// server's stored one, not the suite's.
func checkDefaults(t *testing.T, r *request) {
	t.Helper()
	if r.update {
		return
	}
	raw, err := r.obj.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := apidefaults.Apply(apidefaults.Request{
		Kind: r.obj.GroupVersionKind(), Resource: r.gvr, Operation: apidefaults.Create, Object: raw, Plugins: serverPlugins,
	})
	if err != nil {
		t.Fatalf("%s: defaults: %v", r.test.Name, err)
	}
	offline := &unstructured.Unstructured{}
	if err := offline.UnmarshalJSON(out); err != nil {
		t.Fatal(err)
	}
	got, want := withoutStatus(offline.Object), withoutStatus(r.admitted.Object)
	if !reflect.DeepEqual(got, want) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		t.Errorf("%s: kadmit's defaults differ from the API server's admission input:\n kadmit: %s\n server: %s", r.test.Name, g, w)
	}
}

// withoutStatus drops what the registry's strategy (PrepareForCreate, run
// after mutating admission and before validating admission; k8s.io/kubernetes
// v1.37.1 pkg/registry/...) adds: the status, a DaemonSet's
// template-generation annotation, a Job's generated selector and labels.
// docs/policies-cel.md lists them among what kadmit does not do.
func withoutStatus(obj map[string]any) map[string]any {
	o := scrub(obj)
	delete(o, "status")
	unstructured.RemoveNestedField(o, "metadata", "annotations", "deprecated.daemonset.template.generation")
	if a, _, _ := unstructured.NestedMap(o, "metadata", "annotations"); len(a) == 0 {
		unstructured.RemoveNestedField(o, "metadata", "annotations")
	}
	if o["kind"] == "Job" {
		for _, k := range []string{"batch.kubernetes.io/controller-uid", "batch.kubernetes.io/job-name", "controller-uid", "job-name"} {
			unstructured.RemoveNestedField(o, "metadata", "labels", k)
			unstructured.RemoveNestedField(o, "spec", "template", "metadata", "labels", k)
		}
		unstructured.RemoveNestedField(o, "spec", "selector")
	}
	return o
}

// TestDefaults sends the kinds people test, as written, through the API
// server's decoding and admission with no policy (a dry-run create) and
// compares the result with kadmit's offline defaults.
func TestDefaults(t *testing.T) {
	requireWorld(t)
	tmpl := `
    metadata: {labels: {app: a}}
    spec:
      initContainers: [{name: i, image: busybox, resources: {limits: {cpu: 100m}}}]
      containers:
      - name: c
        image: nginx:1.27
        ports: [{containerPort: 80}]
        resources: {limits: {cpu: 500m, memory: 1Gi}, requests: {memory: 512Mi}}
        livenessProbe: {httpGet: {port: 80}}
        env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
      volumes: [{name: s, secret: {secretName: app-secret}}, {name: cm, configMap: {name: app-config}}]
`
	objects := []string{
		`
apiVersion: v1
kind: Pod
metadata: {name: defaults-pod, namespace: default}
spec:
  tolerations: [{key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute}]
  containers:
  - {name: c, image: nginx, resources: {limits: {cpu: "1", memory: 1Gi}}}
  - {name: d, image: "nginx@sha256:0000000000000000000000000000000000000000000000000000000000000000"}
  ephemeralContainers: []
`,
		`
apiVersion: v1
kind: Pod
metadata: {name: defaults-pod-2, namespace: default}
spec:
  priority: 0
  terminationGracePeriodSeconds: -5
  containers: [{name: c, image: nginx, ports: [{containerPort: 53, protocol: UDP}, {containerPort: 8080}]}]
`,
		"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: defaults-deploy, namespace: default}\nspec:\n  selector: {matchLabels: {app: a}}\n  template:" + tmpl,
		"apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: defaults-sts, namespace: default}\nspec:\n  selector: {matchLabels: {app: a}}\n  volumeClaimTemplates: [{metadata: {name: d}, spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}}]\n  template:" + tmpl,
		"apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: defaults-ds, namespace: default}\nspec:\n  selector: {matchLabels: {app: a}}\n  template:" + tmpl,
		"apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: defaults-rs, namespace: default}\nspec:\n  selector: {matchLabels: {app: a}}\n  template:" + tmpl,
		"apiVersion: batch/v1\nkind: Job\nmetadata: {name: defaults-job, namespace: default}\nspec:\n  template:" + replaceRestart(tmpl),
		"apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: defaults-cj, namespace: default}\nspec:\n  schedule: '*/5 * * * *'\n  jobTemplate:\n    spec:\n      template:" + indent4(replaceRestart(tmpl)),
		`
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: defaults-pvc, namespace: default, finalizers: [example.com/keep]}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
`,
		`
apiVersion: v1
kind: Node
metadata: {name: defaults-node, labels: {pool: a}}
spec:
  taints: [{key: dedicated, value: batch, effect: NoSchedule}]
`,
		`
apiVersion: v1
kind: PersistentVolume
metadata: {name: defaults-pv}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  hostPath: {path: /tmp/defaults-pv}
`,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, y := range objects {
		u := &unstructured.Unstructured{}
		data, err := yaml.YAMLToJSON([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		if err := u.UnmarshalJSON(data); err != nil {
			t.Fatal(err)
		}
		r := &request{obj: u}
		r.test = &policysuite.Test{Name: u.GetKind() + " " + u.GetName()}
		r.gvr, _ = resourceFor(t, u.GroupVersionKind())
		res, err := send(ctx, r)
		if err != nil || !res.Allowed {
			t.Fatalf("%s: %v %s", r.test.Name, err, res)
		}
		r.admitted = &unstructured.Unstructured{Object: res.Object}
		checkDefaults(t, r)
	}
}

// replaceRestart makes a pod template a Job accepts (restartPolicy Never).
func replaceRestart(tmpl string) string {
	return strings.Replace(tmpl, "    spec:\n", "    spec:\n      restartPolicy: Never\n", 1)
}

func indent4(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = "    " + l
		}
	}
	return strings.Join(lines, "\n")
}

// tokenVolumeRE matches the token volume name the ServiceAccount plugin
// generates (names.SimpleNameGenerator: five characters of
// k8s.io/apimachinery's rand alphabet).
var tokenVolumeRE = regexp.MustCompile(`kube-api-access-[bcdfghjklmnpqrstvwxz2456789]{5}`)

// TestDefaultsServiceAccount checks the ServiceAccount plugin's part of
// kadmit's defaults against a kube-apiserver of its own that runs it (the
// shared one does not: test/controlplane disables it). No service account
// controller runs here, so the test creates the accounts the pods use, as
// that controller creates "default"; the server's generated volume name is
// read as kadmit's fixed one.
func TestDefaultsServiceAccount(t *testing.T) {
	requireWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{Dir: world.cp.Dir, APIServerFlags: map[string]string{"disable-admission-plugins": ""}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cp.Stop() }()
	for _, name := range []string{"default", "builder"} {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
		if _, err := cp.Client.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	pods := []string{
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"sa-plain","namespace":"default"},"spec":{
			"initContainers":[{"name":"i","image":"busybox"}],"containers":[{"name":"c","image":"nginx"},{"name":"d","image":"nginx"}]}}`,
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"sa-off","namespace":"default"},"spec":{
			"serviceAccountName":"builder","automountServiceAccountToken":false,"containers":[{"name":"c","image":"nginx"}]}}`,
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"sa-own-mount","namespace":"default"},"spec":{
			"serviceAccountName":"builder",
			"volumes":[{"name":"mine","emptyDir":{}}],
			"containers":[{"name":"c","image":"nginx","volumeMounts":[{"name":"mine","mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}]},{"name":"d","image":"nginx"}]}}`,
	}
	for _, p := range pods {
		var pod corev1.Pod
		if err := json.Unmarshal([]byte(p), &pod); err != nil {
			t.Fatal(err)
		}
		res, err := cp.Client.CoreV1().Pods("default").Create(ctx, &pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatalf("%s: %v", pod.Name, err)
		}
		res.APIVersion, res.Kind = "v1", "Pod"
		served, err := json.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		// The plugin ran (else the comparison below would pass for the
		// wrong reason on a pod kadmit leaves alone).
		if res.Spec.ServiceAccountName == "" || (pod.Spec.AutomountServiceAccountToken == nil) != tokenVolumeRE.Match(served) {
			t.Fatalf("%s: the API server's ServiceAccount plugin did not run: %s", pod.Name, served)
		}
		served = tokenVolumeRE.ReplaceAll(served, []byte(apidefaults.TokenVolumeName))
		out, _, err := apidefaults.Apply(apidefaults.Request{
			Kind: corev1.SchemeGroupVersion.WithKind("Pod"), Resource: corev1.SchemeGroupVersion.WithResource("pods"), Operation: apidefaults.Create, Object: []byte(p),
		})
		if err != nil {
			t.Fatal(err)
		}
		var got, want unstructured.Unstructured
		if err := got.UnmarshalJSON(out); err != nil {
			t.Fatal(err)
		}
		if err := want.UnmarshalJSON(served); err != nil {
			t.Fatal(err)
		}
		if g, w := withoutStatus(got.Object), withoutStatus(want.Object); !reflect.DeepEqual(g, w) {
			gj, _ := json.Marshal(g)
			wj, _ := json.Marshal(w)
			t.Errorf("%s: kadmit's defaults differ from the API server's:\n kadmit: %s\n server: %s", pod.Name, gj, wj)
		}
	}
}
