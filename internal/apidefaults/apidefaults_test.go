package apidefaults

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/kadmit/kadmit/internal/jsonedit"
)

var (
	podKind  = schema.GroupVersionKind{Version: "v1", Kind: "Pod"}
	podsGVR  = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	notReady = `{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}`
	unreach  = `{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}`
)

func j(t *testing.T, y string) []byte {
	t.Helper()
	b, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// at returns the JSON at pointer p of obj, nil when nothing is there.
func at(t *testing.T, obj []byte, p string) []byte {
	t.Helper()
	segs, err := jsonedit.ParsePointer(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := jsonedit.NewDoc(obj).Get(segs...)
	if err != nil {
		return nil
	}
	return got
}

func same(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

// want checks each pointer of obj against its JSON ("" for nothing there).
func want(t *testing.T, obj []byte, ptrs map[string]string) {
	t.Helper()
	for p, w := range ptrs {
		got := at(t, obj, p)
		if w == "" {
			if got != nil {
				t.Errorf("%s: got %s, want nothing", p, got)
			}
			continue
		}
		if got == nil || !same(got, []byte(w)) {
			t.Errorf("%s: got %s, want %s", p, got, w)
		}
	}
}

func applyPod(t *testing.T, op string, obj, old []byte) []byte {
	t.Helper()
	out, _, err := Apply(Request{Kind: podKind, Resource: podsGVR, Operation: op, Object: obj, OldObject: old})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

const plainPod = `
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: default}
spec:
  containers:
  - name: c
    image: nginx:1.27
    resources:
      limits: {cpu: 500m, memory: 1Gi}
      requests: {memory: 512Mi}
  - name: latest
    image: nginx
`

// SetDefaults_Pod (k8s.io/kubernetes v1.37.1 pkg/apis/core/v1/defaults.go:
// 164-196) copies limits to requests a container does not set;
// SetDefaults_Container (defaults.go:82) sets imagePullPolicy from the tag,
// terminationMessagePath/Policy; SetDefaults_PodSpec (defaults.go:243) the
// pod's policies and scheduler.
func TestPodDecodingDefaults(t *testing.T) {
	out := applyPod(t, Create, j(t, plainPod), nil)
	want(t, out, map[string]string{
		"/spec/containers/0/resources/requests":         `{"cpu":"500m","memory":"512Mi"}`,
		"/spec/containers/0/imagePullPolicy":            `"IfNotPresent"`,
		"/spec/containers/1/imagePullPolicy":            `"Always"`,
		"/spec/containers/1/resources/requests":         "",
		"/spec/containers/0/terminationMessagePath":     `"/dev/termination-log"`,
		"/spec/containers/0/terminationMessagePolicy":   `"File"`,
		"/spec/restartPolicy":                           `"Always"`,
		"/spec/dnsPolicy":                               `"ClusterFirst"`,
		"/spec/schedulerName":                           `"default-scheduler"`,
		"/spec/terminationGracePeriodSeconds":           `30`,
		"/spec/securityContext":                         `{}`,
		"/spec/enableServiceLinks":                      `true`,
		"/metadata/name":                                `"p"`,
		"/apiVersion":                                   `"v1"`,
		"/kind":                                         `"Pod"`,
		"/spec/containers/0/resources/limits/cpu":       `"500m"`,
		"/spec/containers/0/resources/limits/memory":    `"1Gi"`,
		"/spec/containers/1/terminationMessagePath":     `"/dev/termination-log"`,
		"/spec/containers/0/volumeMounts/0/name":        `"kube-api-access-kadmt"`,
		"/spec/containers/0/volumeMounts/0/mountPath":   `"/var/run/secrets/kubernetes.io/serviceaccount"`,
		"/spec/containers/0/volumeMounts/0/readOnly":    `true`,
		"/spec/containers/1/volumeMounts/0/name":        `"kube-api-access-kadmt"`,
		"/spec/containers/0/volumeMounts/1":             "",
		"/spec/volumes/0/projected/sources/0":           `{"serviceAccountToken":{"path":"token","expirationSeconds":3607}}`,
		"/spec/volumes/0/projected/defaultMode":         `420`,
		"/spec/volumes/0/projected/sources/1/configMap": `{"name":"kube-root-ca.crt","items":[{"key":"ca.crt","path":"ca.crt"}]}`,
		"/spec/volumes/0/projected/sources/2":           `{"downwardAPI":{"items":[{"path":"namespace","fieldRef":{"apiVersion":"v1","fieldPath":"metadata.namespace"}}]}}`,
		"/spec/volumes/1":                               "",
		"/spec/serviceAccountName":                      `"default"`,
		"/spec/serviceAccount":                          `"default"`,
		"/spec/priority":                                `0`,
		"/spec/preemptionPolicy":                        `"PreemptLowerPriority"`,
		"/spec/tolerations":                             "[" + notReady + "," + unreach + "]",
	})
}

// A pod template is not given the limits-to-requests default (defaults.go:
// 170-172 says so) but its pod spec and containers are defaulted; the
// admission plugins act on pods only.
func TestWorkloadDefaults(t *testing.T) {
	tmpl := `
  template:
    metadata: {labels: {app: a}}
    spec:
      containers: [{name: c, image: nginx, resources: {limits: {cpu: "1"}}}]
`
	for _, tc := range []struct {
		kind schema.GroupVersionKind
		head string
		want map[string]string
	}{
		// apps/v1 defaults.go SetDefaults_Deployment.
		{schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, "spec:\n  selector: {matchLabels: {app: a}}\n" + tmpl, map[string]string{
			"/spec/replicas":                                      `1`,
			"/spec/strategy":                                      `{"type":"RollingUpdate","rollingUpdate":{"maxUnavailable":"25%","maxSurge":"25%"}}`,
			"/spec/revisionHistoryLimit":                          `10`,
			"/spec/progressDeadlineSeconds":                       `600`,
			"/spec/template/spec/containers/0/resources/requests": "",
		}},
		{schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "StatefulSet"}, "spec:\n  selector: {matchLabels: {app: a}}\n  volumeClaimTemplates: [{metadata: {name: d}, spec: {resources: {requests: {storage: 1Gi}}}}]\n" + tmpl, map[string]string{
			"/spec/podManagementPolicy": `"OrderedReady"`,
			// The internal round trip (apps/v1 conversion.go:149-165).
			"/spec/volumeClaimTemplates/0/apiVersion":      `"v1"`,
			"/spec/volumeClaimTemplates/0/kind":            `"PersistentVolumeClaim"`,
			"/spec/volumeClaimTemplates/0/spec/volumeMode": `"Filesystem"`,
			"/spec/updateStrategy/type":                    `"RollingUpdate"`,
			"/spec/replicas":                               `1`,
		}},
		{schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "DaemonSet"}, "spec:\n  selector: {matchLabels: {app: a}}\n" + tmpl, map[string]string{
			"/spec/updateStrategy": `{"type":"RollingUpdate","rollingUpdate":{"maxUnavailable":1,"maxSurge":0}}`,
		}},
		{schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "ReplicaSet"}, "spec:\n  selector: {matchLabels: {app: a}}\n" + tmpl, map[string]string{
			"/spec/replicas": `1`,
		}},
		// batch/v1 defaults.go SetDefaults_Job, SetDefaults_CronJob.
		{schema.GroupVersionKind{Group: "batch", Version: "v1", Kind: "Job"}, "spec:\n" + tmpl, map[string]string{
			"/spec/completions":    `1`,
			"/spec/parallelism":    `1`,
			"/spec/backoffLimit":   `6`,
			"/spec/completionMode": `"NonIndexed"`,
			"/spec/suspend":        `false`,
		}},
		{schema.GroupVersionKind{Group: "batch", Version: "v1", Kind: "CronJob"}, "spec:\n  schedule: '* * * * *'\n  jobTemplate:\n    spec:\n" + indent(tmpl, "    "), map[string]string{
			"/spec/concurrencyPolicy":                                           `"Allow"`,
			"/spec/suspend":                                                     `false`,
			"/spec/successfulJobsHistoryLimit":                                  `3`,
			"/spec/failedJobsHistoryLimit":                                      `1`,
			"/spec/jobTemplate/spec/template/spec/restartPolicy":                `"Always"`,
			"/spec/jobTemplate/spec/template/spec/containers/0/imagePullPolicy": `"Always"`,
		}},
	} {
		t.Run(tc.kind.Kind, func(t *testing.T) {
			obj := j(t, "apiVersion: "+tc.kind.GroupVersion().String()+"\nkind: "+tc.kind.Kind+"\nmetadata: {name: w, namespace: default}\n"+tc.head)
			out, _, err := Apply(Request{Kind: tc.kind, Resource: schema.GroupVersionResource{Group: tc.kind.Group, Version: "v1", Resource: "x"}, Operation: Create, Object: obj})
			if err != nil {
				t.Fatal(err)
			}
			want(t, out, tc.want)
			want(t, out, map[string]string{"/apiVersion": `"` + tc.kind.GroupVersion().String() + `"`, "/kind": `"` + tc.kind.Kind + `"`})
			// The template's pod spec and containers, in every workload.
			p := "/spec/template/spec"
			if tc.kind.Kind == "CronJob" {
				p = "/spec/jobTemplate/spec/template/spec"
			}
			want(t, out, map[string]string{
				p + "/dnsPolicy":                           `"ClusterFirst"`,
				p + "/containers/0/imagePullPolicy":        `"Always"`,
				p + "/containers/0/terminationMessagePath": `"/dev/termination-log"`,
				p + "/containers/0/resources/requests":     "",
				p + "/tolerations":                         "",
				p + "/serviceAccountName":                  "",
			})
		})
	}
}

func indent(s, by string) string {
	var b bytes.Buffer
	for _, l := range bytes.Split([]byte(s), []byte("\n")) {
		if len(l) > 0 {
			b.WriteString(by)
		}
		b.Write(l)
		b.WriteByte('\n')
	}
	return b.String()
}

// DefaultTolerationSeconds appends only the tolerations the pod lacks; a
// toleration without key (or without effect) covers both.
func TestDefaultTolerationSeconds(t *testing.T) {
	pod := func(tol string) []byte {
		return j(t, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"i"}],"tolerations":`+tol+`}}`)
	}
	for _, tc := range []struct{ tol, want string }{
		{`[]`, "[" + notReady + "," + unreach + "]"},
		{`[{"key":"gpu","operator":"Exists"}]`, `[{"key":"gpu","operator":"Exists"},` + notReady + "," + unreach + "]"},
		{`[{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute"}]`, `[{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute"},` + unreach + "]"},
		{`[{"key":"node.kubernetes.io/unreachable","operator":"Exists"}]`, `[{"key":"node.kubernetes.io/unreachable","operator":"Exists"},` + notReady + "]"},
		{`[{"operator":"Exists"}]`, `[{"operator":"Exists"}]`},
		{`[{"operator":"Exists","effect":"NoSchedule"}]`, `[{"operator":"Exists","effect":"NoSchedule"},` + notReady + "," + unreach + "]"},
	} {
		out := applyPod(t, Create, pod(tc.tol), nil)
		want(t, out, map[string]string{"/spec/tolerations": tc.want})
		// UPDATE runs it too (admission.NewHandler(Create, Update)).
		out = applyPod(t, Update, pod(tc.tol), pod(tc.tol))
		want(t, out, map[string]string{"/spec/tolerations": tc.want})
	}
}

func TestServiceAccount(t *testing.T) {
	t.Run("automount off", func(t *testing.T) {
		out := applyPod(t, Create, j(t, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"automountServiceAccountToken":false,"containers":[{"name":"c","image":"i"}]}}`), nil)
		want(t, out, map[string]string{"/spec/serviceAccountName": `"default"`, "/spec/volumes": "", "/spec/containers/0/volumeMounts": ""})
	})
	t.Run("named account, a container mounting the path, an existing token volume", func(t *testing.T) {
		out := applyPod(t, Create, j(t, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"serviceAccountName":"builder",
			"volumes":[{"name":"kube-api-access-abcde","emptyDir":{}}],
			"initContainers":[{"name":"i","image":"i"}],
			"containers":[{"name":"c","image":"i","volumeMounts":[{"name":"x","mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}]}]}}`), nil)
		want(t, out, map[string]string{
			"/spec/serviceAccountName":                   `"builder"`,
			"/spec/serviceAccount":                       `"builder"`, // SetDefaults_PodSpec keeps the alias in sync
			"/spec/volumes/0/name":                       `"kube-api-access-abcde"`,
			"/spec/volumes/1":                            "",
			"/spec/initContainers/0/volumeMounts/0/name": `"kube-api-access-abcde"`,
			"/spec/containers/0/volumeMounts/0/name":     `"x"`,
			"/spec/containers/0/volumeMounts/1":          "",
		})
	})
	t.Run("mirror pod", func(t *testing.T) {
		out := applyPod(t, Create, j(t, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","annotations":{"kubernetes.io/config.mirror":"x"}},"spec":{"containers":[{"name":"c","image":"i"}]}}`), nil)
		want(t, out, map[string]string{"/spec/serviceAccountName": "", "/spec/volumes": ""})
	})
	t.Run("not on UPDATE", func(t *testing.T) {
		pod := j(t, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"i"}]}}`)
		out, old, err := Apply(Request{Kind: podKind, Resource: podsGVR, Operation: Update, Object: pod, OldObject: pod})
		if err != nil {
			t.Fatal(err)
		}
		want(t, out, map[string]string{"/spec/serviceAccountName": "", "/spec/volumes": ""})
		// The old object is the stored one: admitted when it was created.
		want(t, old, map[string]string{"/spec/serviceAccountName": `"default"`, "/spec/volumes/0/name": `"kube-api-access-kadmt"`})
	})
}

func TestPriority(t *testing.T) {
	pod := func(spec string) []byte {
		return j(t, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"i"}]`+spec+`}}`)
	}
	out := applyPod(t, Create, pod(`,"priorityClassName":"high"`), nil)
	want(t, out, map[string]string{"/spec/priority": "", "/spec/preemptionPolicy": "", "/spec/priorityClassName": `"high"`})
	out = applyPod(t, Create, pod(`,"preemptionPolicy":"Never"`), nil)
	want(t, out, map[string]string{"/spec/priority": "0", "/spec/preemptionPolicy": `"Never"`})
	// UPDATE keeps the old pod's (here: as created, 0) when the new has none.
	out = applyPod(t, Update, pod(``), pod(`,"priorityClassName":"x","priority":7,"preemptionPolicy":"Never"`))
	want(t, out, map[string]string{"/spec/priority": "7", "/spec/preemptionPolicy": `"Never"`})
}

func TestPluginsSelection(t *testing.T) {
	pod := j(t, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"i"}]}}`)
	out, _, err := Apply(Request{Kind: podKind, Resource: podsGVR, Operation: Create, Object: pod, Plugins: []string{DefaultTolerationSeconds}})
	if err != nil {
		t.Fatal(err)
	}
	want(t, out, map[string]string{"/spec/serviceAccountName": "", "/spec/priority": "", "/spec/tolerations/1/key": `"node.kubernetes.io/unreachable"`, "/spec/restartPolicy": `"Always"`})
	// A subresource or another resource: decoding defaults only.
	for _, r := range []Request{
		{Kind: podKind, Resource: podsGVR, SubResource: "status", Operation: Update, Object: pod, OldObject: pod},
		{Kind: podKind, Resource: schema.GroupVersionResource{Version: "v1", Resource: "podthings"}, Operation: Create, Object: pod},
	} {
		out, old, err := Apply(r)
		if err != nil {
			t.Fatal(err)
		}
		want(t, out, map[string]string{"/spec/tolerations": "", "/spec/serviceAccountName": "", "/spec/restartPolicy": `"Always"`})
		if old != nil {
			// The old object is the stored one, created through pods.
			want(t, old, map[string]string{"/spec/tolerations/0/key": `"node.kubernetes.io/not-ready"`})
		}
	}
}

func TestUnknownKindsAndBadInput(t *testing.T) {
	ing := []byte(`{"apiVersion":"networking.k8s.io/v1","kind":"Ingress","metadata":{"name":"i"},"spec":{"x":1}}`)
	out, old, err := Apply(Request{Kind: schema.GroupVersionKind{Group: "networking.k8s.io", Version: "v1", Kind: "Ingress"}, Operation: Update, Object: ing, OldObject: ing})
	if err != nil || !bytes.Equal(out, ing) || !bytes.Equal(old, ing) {
		t.Fatalf("unknown kind changed: %s %s %v", out, old, err)
	}
	// DELETE: no object, the old one defaulted.
	pod := j(t, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"i"}]}}`)
	out, old, err = Apply(Request{Kind: podKind, Resource: podsGVR, Operation: Delete, OldObject: pod})
	if err != nil || out != nil {
		t.Fatalf("DELETE: %s %v", out, err)
	}
	want(t, old, map[string]string{"/spec/restartPolicy": `"Always"`})
	// Unknown fields are dropped, as the API server drops them.
	out = applyPod(t, Create, j(t, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"bogus":1,"containers":[{"name":"c","image":"i"}]}}`), nil)
	want(t, out, map[string]string{"/spec/bogus": ""})
	for _, bad := range []string{
		`{"apiVersion":"v1","kind":"Pod","spec":{"containers":"nope"}}`,
		`{"apiVersion":"v1","kind":"Pod","spec":{"priority":"high"}}`,
	} {
		_, _, err := Apply(Request{Kind: podKind, Resource: podsGVR, Operation: Create, Object: []byte(bad)})
		if !errors.Is(err, ErrInput) {
			t.Errorf("%s: got %v, want ErrInput", bad, err)
		}
	}
}

func TestStorageObjectInUseProtection(t *testing.T) {
	for _, tc := range []struct{ kind, resource, obj, want string }{
		{"PersistentVolumeClaim", "persistentvolumeclaims", `{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"c","finalizers":["x"]},"spec":{"resources":{"requests":{"storage":"1Gi"}}}}`, `["x","kubernetes.io/pvc-protection"]`},
		{"PersistentVolumeClaim", "persistentvolumeclaims", `{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"c","finalizers":["kubernetes.io/pvc-protection"]}}`, `["kubernetes.io/pvc-protection"]`},
		{"PersistentVolume", "persistentvolumes", `{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":"v"},"spec":{"hostPath":{"path":"/x"}}}`, `["kubernetes.io/pv-protection"]`},
	} {
		gvk := schema.GroupVersionKind{Version: "v1", Kind: tc.kind}
		gvr := schema.GroupVersionResource{Version: "v1", Resource: tc.resource}
		out, _, err := Apply(Request{Kind: gvk, Resource: gvr, Operation: Create, Object: []byte(tc.obj)})
		if err != nil {
			t.Fatal(err)
		}
		want(t, out, map[string]string{"/metadata/finalizers": tc.want})
		// CREATE only.
		out, _, err = Apply(Request{Kind: gvk, Resource: gvr, Operation: Update, Object: []byte(tc.obj), OldObject: []byte(tc.obj)})
		if err != nil {
			t.Fatal(err)
		}
		if got := at(t, out, "/metadata/finalizers"); same(got, []byte(tc.want)) && !same([]byte(tc.want), at(t, []byte(tc.obj), "/metadata/finalizers")) {
			t.Errorf("%s UPDATE: got %s, want the finalizers as written", tc.kind, got)
		}
	}
	// Its PVC defaults: volumeMode Filesystem (core/v1 SetDefaults_PersistentVolumeClaimSpec).
	out, _, _ := Apply(Request{Kind: schema.GroupVersionKind{Version: "v1", Kind: "PersistentVolumeClaim"}, Resource: schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}, Operation: Create,
		Object: []byte(`{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"c"}}`)})
	want(t, out, map[string]string{"/spec/volumeMode": `"Filesystem"`, "/status/phase": `"Pending"`})
}

func TestMutatedAndDefaulter(t *testing.T) {
	pod := j(t, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"i","resources":{"limits":{"cpu":"1"}}}]}}`)
	out, err := Mutated(podKind, pod)
	if err != nil {
		t.Fatal(err)
	}
	// Decoding defaults, no admission plugin.
	want(t, out, map[string]string{"/spec/containers/0/resources/requests/cpu": `"1"`, "/spec/tolerations": "", "/spec/serviceAccountName": "", "/kind": `"Pod"`})

	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(pod); err != nil {
		t.Fatal(err)
	}
	Defaulter.Default(u)
	b, err := u.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	want(t, b, map[string]string{"/spec/containers/0/imagePullPolicy": `"Always"`, "/spec/containers/0/resources/requests/cpu": `"1"`, "/apiVersion": `"v1"`, "/kind": `"Pod"`})

	// Kinds it does not know are left alone.
	crd := []byte(`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"},"spec":{"x":1}}`)
	if out, err := Mutated(schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"}, crd); err != nil || !bytes.Equal(out, crd) {
		t.Errorf("Widget: %s %v", out, err)
	}
	w := &unstructured.Unstructured{}
	_ = w.UnmarshalJSON(crd)
	Defaulter.Default(w)
	if b, _ := w.MarshalJSON(); !same(b, crd) {
		t.Errorf("Widget defaulted: %s", b)
	}
}

func TestTaintNodesByCondition(t *testing.T) {
	gvk := schema.GroupVersionKind{Version: "v1", Kind: "Node"}
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	for _, tc := range []struct{ taints, want string }{
		{`[]`, `[{"key":"node.kubernetes.io/not-ready","effect":"NoSchedule"}]`},
		{`[{"key":"gpu","effect":"NoSchedule"}]`, `[{"key":"gpu","effect":"NoSchedule"},{"key":"node.kubernetes.io/not-ready","effect":"NoSchedule"}]`},
		{`[{"key":"node.kubernetes.io/not-ready","value":"x","effect":"NoSchedule"}]`, `[{"key":"node.kubernetes.io/not-ready","value":"x","effect":"NoSchedule"}]`},
		{`[{"key":"node.kubernetes.io/not-ready","effect":"NoExecute"}]`, `[{"key":"node.kubernetes.io/not-ready","effect":"NoExecute"},{"key":"node.kubernetes.io/not-ready","effect":"NoSchedule"}]`},
	} {
		node := []byte(`{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"},"spec":{"taints":` + tc.taints + `}}`)
		out, _, err := Apply(Request{Kind: gvk, Resource: gvr, Operation: Create, Object: node})
		if err != nil {
			t.Fatal(err)
		}
		want(t, out, map[string]string{"/spec/taints": tc.want})
		// CREATE only; the status subresource neither.
		for _, r := range []Request{
			{Kind: gvk, Resource: gvr, Operation: Update, Object: node, OldObject: node},
			{Kind: gvk, Resource: gvr, SubResource: "status", Operation: Create, Object: node},
		} {
			out, _, err := Apply(r)
			if err != nil {
				t.Fatal(err)
			}
			if tc.taints == `[]` {
				want(t, out, map[string]string{"/spec/taints": ""})
			}
		}
	}
}
