package nodeovercommit

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/testkit"
)

// node builds a node JSON with the given annotations and status resources.
func node(t *testing.T, annotations map[string]string, capacity, allocatable map[string]string) string {
	t.Helper()
	n := map[string]any{
		"apiVersion": "v1",
		"kind":       "Node",
		"metadata":   map[string]any{"name": "n1", "creationTimestamp": nil},
		"spec":       map[string]any{"podCIDR": "10.0.0.0/24"},
		"status": map[string]any{
			"conditions": []any{map[string]any{"type": "Ready", "status": "True"}},
		},
	}
	if annotations != nil {
		n["metadata"].(map[string]any)["annotations"] = annotations
	}
	if capacity != nil {
		n["status"].(map[string]any)["capacity"] = capacity
	}
	if allocatable != nil {
		n["status"].(map[string]any)["allocatable"] = allocatable
	}
	b, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func request(op admissionv1.Operation, subresource, raw, old string) *admission.Request {
	return testkit.Request(op, testkit.Nodes, raw, old, testkit.UID("uid-1"), testkit.SubResource(subresource),
		testkit.Kind(metav1.GroupVersionKind{Version: "v1", Kind: "Node"}))
}

type webhooks struct {
	mutate, validate *admission.Webhook
}

func newWebhooks(t *testing.T, cfg Config) (*Policy, webhooks) {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	whs, err := admission.NewWebhooks(p.Hooks())
	if err != nil {
		t.Fatal(err)
	}
	var w webhooks
	for _, wh := range whs {
		switch wh.Path {
		case MutatePath:
			w.mutate = wh
		case ValidatePath:
			w.validate = wh
		default:
			t.Fatalf("unexpected path %s", wh.Path)
		}
	}
	if w.mutate == nil || w.validate == nil {
		t.Fatalf("missing webhook: %+v", whs)
	}
	return p, w
}

// mutate reviews req on the mutating webhook, checks the response is allowed
// and that the patch touches only what the policy may touch, and returns the
// object with the patch applied (the input when there is no patch).
func mutate(t *testing.T, wh *admission.Webhook, req *admission.Request) ([]byte, *admissionv1.AdmissionResponse) {
	t.Helper()
	out, err := wh.Review(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	resp := out.Response
	if !resp.Allowed {
		t.Fatalf("denied: %+v", resp.Result)
	}
	if resp.Patch == nil {
		if resp.PatchType != nil || out.Patch != nil {
			t.Fatalf("patch type without patch: %+v", resp)
		}
		return req.Object.Raw, resp
	}
	if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("PatchType = %v", resp.PatchType)
	}
	for _, op := range out.Patch {
		if !strings.HasPrefix(op.Path, "/metadata/annotations") && !strings.HasPrefix(op.Path, "/status/allocatable") &&
			!strings.HasPrefix(op.Path, "/status/capacity") {
			t.Errorf("patch touches %s: %s", op.Path, resp.Patch)
		}
	}
	patch, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := patch.Apply(req.Object.Raw)
	if err != nil {
		t.Fatalf("apply %s: %v", resp.Patch, err)
	}
	if !reflect.DeepEqual(decode(t, patched), decode(t, out.Object)) {
		t.Fatalf("patched object %s differs from Outcome.Object %s", patched, out.Object)
	}
	return patched, resp
}

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return m
}

// state is what a test checks of a node: its annotations and status
// resources.
type state struct {
	annotations           map[string]string
	capacity, allocatable map[string]string
}

func stateOf(t *testing.T, raw []byte) state {
	t.Helper()
	var n struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Status struct {
			Capacity    map[string]string `json:"capacity"`
			Allocatable map[string]string `json:"allocatable"`
		} `json:"status"`
	}
	if err := json.Unmarshal(raw, &n); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	return state{n.Metadata.Annotations, n.Status.Capacity, n.Status.Allocatable}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"default", DefaultConfig(), ""},
		{"several", Config{Ratios: map[corev1.ResourceName]string{"cpu": "1.5", "memory": "1.2", "pods": "4"}, MaxRatio: "4"}, ""},
		{"ratio 1 and max 1", Config{Ratios: map[corev1.ResourceName]string{"cpu": "1"}, MaxRatio: "1"}, ""},
		{"ratio below 1", Config{Ratios: map[corev1.ResourceName]string{"cpu": "0.5"}, MaxRatio: "4"}, `ratios.cpu: must be a decimal in [1, 4], got "0.5"`},
		{"ratio above max", Config{Ratios: map[corev1.ResourceName]string{"cpu": "4.5"}, MaxRatio: "4"}, `ratios.cpu: must be a decimal in [1, 4], got "4.5"`},
		{"ratio not decimal", Config{Ratios: map[corev1.ResourceName]string{"memory": "1.2x"}, MaxRatio: "4"}, `ratios.memory: must be a decimal in [1, 4], got "1.2x"`},
		{"first bad in name order", Config{Ratios: map[corev1.ResourceName]string{"pods": "0", "cpu": "9", "memory": "0"}, MaxRatio: "4"}, `ratios.cpu: must be a decimal in [1, 4], got "9"`},
		{"empty resource", Config{Ratios: map[corev1.ResourceName]string{"": "2"}, MaxRatio: "4"}, "ratios: resource name must not be empty"},
		{"no ratios", Config{MaxRatio: "4"}, "ratios: must name at least one resource"},
		{"max below 1", Config{Ratios: map[corev1.ResourceName]string{"cpu": "1"}, MaxRatio: "0.9"}, `maxRatio: must be a decimal >= 1, got "0.9"`},
		{"max missing", Config{Ratios: map[corev1.ResourceName]string{"cpu": "1"}}, `maxRatio: must be a decimal >= 1, got ""`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			_, newErr := New(tt.cfg)
			if tt.wantErr == "" {
				if err != nil || newErr != nil {
					t.Fatalf("Validate() = %v, New() = %v", err, newErr)
				}
				return
			}
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("Validate() = %v, want %q", err, tt.wantErr)
			}
			if newErr == nil || newErr.Error() != tt.wantErr {
				t.Fatalf("New() = %v, want %q", newErr, tt.wantErr)
			}
		})
	}
}

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	if c.MaxRatio != "4" || !reflect.DeepEqual(c.Ratios, map[corev1.ResourceName]string{"cpu": "2"}) {
		t.Fatalf("DefaultConfig() = %+v", c)
	}
	c.Ratios["memory"] = "2"
	if len(DefaultConfig().Ratios) != 1 {
		t.Fatal("DefaultConfig shares its ratios map")
	}
}

func TestHooks(t *testing.T) {
	p, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	hooks := p.Hooks()
	if len(hooks) != 2 {
		t.Fatalf("got %d hooks", len(hooks))
	}
	rule := func(res string, ops ...admissionregistrationv1.OperationType) admissionregistrationv1.RuleWithOperations {
		return admissionregistrationv1.RuleWithOperations{Operations: ops, Rule: admissionregistrationv1.Rule{
			APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{res}}}
	}
	m, v := hooks[0], hooks[1]
	wantM := []admissionregistrationv1.RuleWithOperations{rule("nodes", "CREATE"), rule("nodes/status", "UPDATE")}
	if m.Policy != Name || m.Path != "/mutate-node-status" || m.Type != admission.Mutating || m.Mutator == nil ||
		m.FailurePolicy != admissionregistrationv1.Ignore || !reflect.DeepEqual(m.Rules, wantM) {
		t.Fatalf("unexpected mutating hook %+v", m)
	}
	wantV := []admissionregistrationv1.RuleWithOperations{rule("nodes", "CREATE", "UPDATE")}
	if v.Policy != Name || v.Path != "/validate-node" || v.Type != admission.Validating || v.Validator == nil ||
		v.FailurePolicy != admissionregistrationv1.Ignore || !reflect.DeepEqual(v.Rules, wantV) {
		t.Fatalf("unexpected validating hook %+v", v)
	}

	// Which requests each hook sees.
	matches := []struct {
		op          admissionv1.Operation
		subresource string
		mutate      bool
		validate    bool
	}{
		{admissionv1.Create, "", true, true},
		{admissionv1.Update, "", false, true},
		{admissionv1.Update, "status", true, false},
		{admissionv1.Delete, "", false, false},
		{admissionv1.Create, "status", false, false},
	}
	for _, mt := range matches {
		req := request(mt.op, mt.subresource, "{}", "")
		if got := m.Matches(req); got != mt.mutate {
			t.Errorf("mutating hook matches %s %q = %v", mt.op, mt.subresource, got)
		}
		if got := v.Matches(req); got != mt.validate {
			t.Errorf("validating hook matches %s %q = %v", mt.op, mt.subresource, got)
		}
	}
}

// The lifecycle from the design: registration, reinvocation, the kubelet
// re-posting raw values, and the kubelet posting new raw values.
func TestMutateLifecycle(t *testing.T) {
	_, w := newWebhooks(t, DefaultConfig())

	// Registration: capacity 4, allocatable 3500m.
	created, _ := mutate(t, w.mutate, request(admissionv1.Create, "", node(t, nil,
		map[string]string{"cpu": "4", "memory": "8Gi", "pods": "110"},
		map[string]string{"cpu": "3500m", "memory": "7Gi", "pods": "110"}), ""))
	want := state{
		annotations: map[string]string{AnnotationRaw: `{"allocatable":{"cpu":"3500m"},"capacity":{"cpu":"4"}}`},
		capacity:    map[string]string{"cpu": "7500m", "memory": "8Gi", "pods": "110"},
		allocatable: map[string]string{"cpu": "7", "memory": "7Gi", "pods": "110"},
	}
	if got := stateOf(t, created); !reflect.DeepEqual(got, want) {
		t.Fatalf("after create\n got %+v\nwant %+v", got, want)
	}

	// Reinvocation on its own output: no patch.
	again, resp := mutate(t, w.mutate, request(admissionv1.Create, "", string(created), ""))
	if resp.Patch != nil || string(again) != string(created) {
		t.Fatalf("reinvocation patched: %s", resp.Patch)
	}
	// A status write that is not the kubelet's carries the amplified values.
	_, resp = mutate(t, w.mutate, request(admissionv1.Update, "status", string(created), string(created)))
	if resp.Patch != nil {
		t.Fatalf("status write of amplified values patched: %s", resp.Patch)
	}

	// The kubelet posts its raw values again; the annotation is still there
	// since the kubelet's patch merges into the stored object.
	repost := node(t, want.annotations,
		map[string]string{"cpu": "4", "memory": "8Gi", "pods": "110"},
		map[string]string{"cpu": "3500m", "memory": "7Gi", "pods": "110"})
	reposted, resp := mutate(t, w.mutate, request(admissionv1.Update, "status", repost, string(created)))
	if got := stateOf(t, reposted); !reflect.DeepEqual(got, want) {
		t.Fatalf("after re-post\n got %+v\nwant %+v", got, want)
	}
	if ops := string(resp.Patch); strings.Contains(ops, "annotations") {
		t.Errorf("re-post rewrote the annotation: %s", ops)
	}

	// The kubelet posts new raw values: allocatable 3, capacity 4.
	newRaw := node(t, want.annotations,
		map[string]string{"cpu": "4", "memory": "8Gi", "pods": "110"},
		map[string]string{"cpu": "3", "memory": "7Gi", "pods": "110"})
	updated, _ := mutate(t, w.mutate, request(admissionv1.Update, "status", newRaw, string(reposted)))
	want = state{
		annotations: map[string]string{AnnotationRaw: `{"allocatable":{"cpu":"3"},"capacity":{"cpu":"4"}}`},
		capacity:    map[string]string{"cpu": "7", "memory": "8Gi", "pods": "110"},
		allocatable: map[string]string{"cpu": "6", "memory": "7Gi", "pods": "110"},
	}
	if got := stateOf(t, updated); !reflect.DeepEqual(got, want) {
		t.Fatalf("after new raw\n got %+v\nwant %+v", got, want)
	}
	if _, resp := mutate(t, w.mutate, request(admissionv1.Update, "status", string(updated), string(updated))); resp.Patch != nil {
		t.Fatalf("second pass patched: %s", resp.Patch)
	}
}

func TestMutate(t *testing.T) {
	cpuMem := Config{Ratios: map[corev1.ResourceName]string{"cpu": "2", "memory": "1.2"}, MaxRatio: "4"}
	tests := []struct {
		name         string
		cfg          Config
		annotations  map[string]string
		capacity     map[string]string
		allocatable  map[string]string
		want         *state // nil: no patch
		wantWarnings []string
	}{
		{
			name:        "memory Gi times 1.2",
			cfg:         cpuMem,
			capacity:    map[string]string{"cpu": "4", "memory": "16Gi"},
			allocatable: map[string]string{"cpu": "4", "memory": "15Gi"},
			want: &state{
				annotations: map[string]string{AnnotationRaw: `{"allocatable":{"cpu":"4","memory":"15Gi"},"capacity":{"cpu":"4","memory":"16Gi"}}`},
				capacity:    map[string]string{"cpu": "8", "memory": "19Gi"},
				allocatable: map[string]string{"cpu": "8", "memory": "18Gi"},
			},
		},
		{
			name:        "no configured resource: untouched",
			cfg:         DefaultConfig(),
			capacity:    map[string]string{"memory": "16Gi", "pods": "110"},
			allocatable: map[string]string{"memory": "15Gi", "pods": "110"},
		},
		{
			name: "no status at all: untouched",
			cfg:  DefaultConfig(),
		},
		{
			name:        "resource missing from capacity is skipped",
			cfg:         cpuMem,
			capacity:    map[string]string{"cpu": "4"},
			allocatable: map[string]string{"cpu": "4", "memory": "15Gi"},
			want: &state{
				annotations: map[string]string{AnnotationRaw: `{"allocatable":{"cpu":"4"},"capacity":{"cpu":"4"}}`},
				capacity:    map[string]string{"cpu": "8"},
				allocatable: map[string]string{"cpu": "8", "memory": "15Gi"},
			},
		},
		{
			name:        "allocatable above capacity keeps no reserve",
			cfg:         DefaultConfig(),
			capacity:    map[string]string{"cpu": "2"},
			allocatable: map[string]string{"cpu": "3"},
			want: &state{
				annotations: map[string]string{AnnotationRaw: `{"allocatable":{"cpu":"3"},"capacity":{"cpu":"2"}}`},
				capacity:    map[string]string{"cpu": "6"},
				allocatable: map[string]string{"cpu": "6"},
			},
		},
		{
			name:        "ratio 1 records raw values only",
			cfg:         Config{Ratios: map[corev1.ResourceName]string{"cpu": "1"}, MaxRatio: "4"},
			capacity:    map[string]string{"cpu": "4"},
			allocatable: map[string]string{"cpu": "3500m"},
			want: &state{
				annotations: map[string]string{AnnotationRaw: `{"allocatable":{"cpu":"3500m"},"capacity":{"cpu":"4"}}`},
				capacity:    map[string]string{"cpu": "4"},
				allocatable: map[string]string{"cpu": "3500m"},
			},
		},
		{
			name:        "override replaces named ratios only",
			cfg:         cpuMem,
			annotations: map[string]string{AnnotationRatio: `{"cpu":"1.5"}`},
			capacity:    map[string]string{"cpu": "4", "memory": "16Gi"},
			allocatable: map[string]string{"cpu": "4", "memory": "15Gi"},
			want: &state{
				annotations: map[string]string{
					AnnotationRatio: `{"cpu":"1.5"}`,
					AnnotationRaw:   `{"allocatable":{"cpu":"4","memory":"15Gi"},"capacity":{"cpu":"4","memory":"16Gi"}}`,
				},
				capacity:    map[string]string{"cpu": "6", "memory": "19Gi"},
				allocatable: map[string]string{"cpu": "6", "memory": "18Gi"},
			},
		},
		{
			name:        "override of an unconfigured resource is ignored",
			cfg:         DefaultConfig(),
			annotations: map[string]string{AnnotationRatio: `{"cpu":"1.5","memory":"1.2"}`},
			capacity:    map[string]string{"cpu": "4", "memory": "16Gi"},
			allocatable: map[string]string{"cpu": "4", "memory": "15Gi"},
			want: &state{
				annotations: map[string]string{
					AnnotationRatio: `{"cpu":"1.5","memory":"1.2"}`,
					AnnotationRaw:   `{"allocatable":{"cpu":"4"},"capacity":{"cpu":"4"}}`,
				},
				capacity:    map[string]string{"cpu": "6", "memory": "16Gi"},
				allocatable: map[string]string{"cpu": "6", "memory": "15Gi"},
			},
		},
		{
			name:        "unparsable override ignored with a warning",
			cfg:         DefaultConfig(),
			annotations: map[string]string{AnnotationRatio: `cpu=1.5`},
			capacity:    map[string]string{"cpu": "4"},
			allocatable: map[string]string{"cpu": "4"},
			want: &state{
				annotations: map[string]string{
					AnnotationRatio: `cpu=1.5`,
					AnnotationRaw:   `{"allocatable":{"cpu":"4"},"capacity":{"cpu":"4"}}`,
				},
				capacity:    map[string]string{"cpu": "8"},
				allocatable: map[string]string{"cpu": "8"},
			},
			wantWarnings: []string{"annotation kadmit.io/overcommit-ratio ignored: must be a JSON object"},
		},
		{
			name:        "out-of-range override ignored with a warning",
			cfg:         DefaultConfig(),
			annotations: map[string]string{AnnotationRatio: `{"cpu":"8"}`},
			capacity:    map[string]string{"cpu": "4"},
			allocatable: map[string]string{"cpu": "4"},
			want: &state{
				annotations: map[string]string{
					AnnotationRatio: `{"cpu":"8"}`,
					AnnotationRaw:   `{"allocatable":{"cpu":"4"},"capacity":{"cpu":"4"}}`,
				},
				capacity:    map[string]string{"cpu": "8"},
				allocatable: map[string]string{"cpu": "8"},
			},
			wantWarnings: []string{`annotation kadmit.io/overcommit-ratio ignored: ratio for "cpu" must be a decimal in [1, 4], got "8"`},
		},
		{
			name:        "unparsable raw annotation: incoming taken as raw, warning",
			cfg:         DefaultConfig(),
			annotations: map[string]string{AnnotationRaw: `{"allocatable":`},
			capacity:    map[string]string{"cpu": "4"},
			allocatable: map[string]string{"cpu": "3500m"},
			want: &state{
				annotations: map[string]string{AnnotationRaw: `{"allocatable":{"cpu":"3500m"},"capacity":{"cpu":"4"}}`},
				capacity:    map[string]string{"cpu": "7500m"},
				allocatable: map[string]string{"cpu": "7"},
			},
			wantWarnings: []string{"annotation kadmit.io/raw-allocatable is unreadable"},
		},
		{
			name:        "bad quantity in raw annotation: incoming taken as raw, warning",
			cfg:         DefaultConfig(),
			annotations: map[string]string{AnnotationRaw: `{"allocatable":{"cpu":"lots"},"capacity":{"cpu":"4"}}`},
			capacity:    map[string]string{"cpu": "4"},
			allocatable: map[string]string{"cpu": "3500m"},
			want: &state{
				annotations: map[string]string{AnnotationRaw: `{"allocatable":{"cpu":"3500m"},"capacity":{"cpu":"4"}}`},
				capacity:    map[string]string{"cpu": "7500m"},
				allocatable: map[string]string{"cpu": "7"},
			},
			wantWarnings: []string{"annotation kadmit.io/raw-allocatable is unreadable"},
		},
		{
			name:        "already amplified with non-canonical annotation: untouched",
			cfg:         DefaultConfig(),
			annotations: map[string]string{AnnotationRaw: `{"capacity":{"cpu":"4000m"},"allocatable":{"cpu":"3.5"}}`},
			capacity:    map[string]string{"cpu": "7500m"},
			allocatable: map[string]string{"cpu": "7000m"},
		},
		{
			name:        "one resource amplified, another newly configured",
			cfg:         cpuMem,
			annotations: map[string]string{AnnotationRaw: `{"allocatable":{"cpu":"3500m"},"capacity":{"cpu":"4"}}`},
			capacity:    map[string]string{"cpu": "7500m", "memory": "16Gi"},
			allocatable: map[string]string{"cpu": "7", "memory": "15Gi"},
			want: &state{
				annotations: map[string]string{AnnotationRaw: `{"allocatable":{"cpu":"3500m","memory":"15Gi"},"capacity":{"cpu":"4","memory":"16Gi"}}`},
				capacity:    map[string]string{"cpu": "7500m", "memory": "19Gi"},
				allocatable: map[string]string{"cpu": "7", "memory": "18Gi"},
			},
		},
		{
			name:        "stale entries dropped from the raw annotation",
			cfg:         DefaultConfig(),
			annotations: map[string]string{AnnotationRaw: `{"allocatable":{"cpu":"3500m","memory":"1Gi"},"capacity":{"cpu":"4","memory":"2Gi"}}`},
			capacity:    map[string]string{"cpu": "7500m", "memory": "2Gi"},
			allocatable: map[string]string{"cpu": "7", "memory": "1Gi"},
			want: &state{
				annotations: map[string]string{AnnotationRaw: `{"allocatable":{"cpu":"3500m"},"capacity":{"cpu":"4"}}`},
				capacity:    map[string]string{"cpu": "7500m", "memory": "2Gi"},
				allocatable: map[string]string{"cpu": "7", "memory": "1Gi"},
			},
		},
		{
			name:        "raw annotation removed when no configured resource is left",
			cfg:         DefaultConfig(),
			annotations: map[string]string{AnnotationRaw: `{"allocatable":{"cpu":"3500m"},"capacity":{"cpu":"4"}}`, "other": "x"},
			capacity:    map[string]string{"memory": "2Gi"},
			allocatable: map[string]string{"memory": "1Gi"},
			want: &state{
				annotations: map[string]string{"other": "x"},
				capacity:    map[string]string{"memory": "2Gi"},
				allocatable: map[string]string{"memory": "1Gi"},
			},
		},
		{
			name:        "ratio changed in the override: kubelet raw values re-amplified",
			cfg:         DefaultConfig(),
			annotations: map[string]string{AnnotationRaw: `{"allocatable":{"cpu":"3500m"},"capacity":{"cpu":"4"}}`, AnnotationRatio: `{"cpu":"3"}`},
			capacity:    map[string]string{"cpu": "4"},
			allocatable: map[string]string{"cpu": "3500m"},
			want: &state{
				annotations: map[string]string{AnnotationRaw: `{"allocatable":{"cpu":"3500m"},"capacity":{"cpu":"4"}}`, AnnotationRatio: `{"cpu":"3"}`},
				capacity:    map[string]string{"cpu": "11"},
				allocatable: map[string]string{"cpu": "10500m"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, w := newWebhooks(t, tt.cfg)
			in := node(t, tt.annotations, tt.capacity, tt.allocatable)
			for _, req := range []*admission.Request{
				request(admissionv1.Create, "", in, ""),
				request(admissionv1.Update, "status", in, in),
			} {
				got, resp := mutate(t, w.mutate, req)
				if len(resp.Warnings) != len(tt.wantWarnings) {
					t.Fatalf("warnings = %q, want %q", resp.Warnings, tt.wantWarnings)
				}
				for i, want := range tt.wantWarnings {
					if !strings.HasPrefix(resp.Warnings[i], want) {
						t.Errorf("warning %q, want prefix %q", resp.Warnings[i], want)
					}
				}
				if tt.want == nil {
					if resp.Patch != nil {
						t.Fatalf("unexpected patch %s", resp.Patch)
					}
					continue
				}
				if resp.Patch == nil {
					t.Fatal("no patch")
				}
				if st := stateOf(t, got); !reflect.DeepEqual(st, *tt.want) {
					t.Fatalf("\n got %+v\nwant %+v", st, *tt.want)
				}
				// Everything else is as it came in.
				gotObj, inObj := decode(t, got), decode(t, []byte(in))
				for _, obj := range []map[string]any{gotObj, inObj} {
					delete(obj["metadata"].(map[string]any), "annotations")
					delete(obj["status"].(map[string]any), "capacity")
					delete(obj["status"].(map[string]any), "allocatable")
				}
				if !reflect.DeepEqual(gotObj, inObj) {
					t.Fatalf("other fields changed:\n got %v\nwant %v", gotObj, inObj)
				}
				// Idempotent: the output is left alone.
				if ops, v := p.Mutate(context.Background(), request(admissionv1.Update, "status", string(got), string(got))); ops != nil || !v.Allowed {
					t.Fatalf("second pass = %v, %+v", ops, v)
				}
			}
		})
	}
}

// Fields the typed Node does not know, and spellings a typed round trip would
// change, survive: the patch holds only the resource and annotation changes.
func TestMutatePatchIsMinimal(t *testing.T) {
	in := `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","creationTimestamp":null,"labels":{"a":"<b>"}},` +
		`"spec":{"futureField":[1,2.50,1e3]},"status":{"capacity":{"cpu":"4","example.com/x":"1"},` +
		`"allocatable":{"cpu":"3500m","example.com/x":"1"},"nodeInfo":{"bootID":"x"},"newStatus":{"n":12345678901234567890}}}`
	_, w := newWebhooks(t, DefaultConfig())
	out, err := w.mutate.Review(context.Background(), request(admissionv1.Create, "", in, ""))
	if err != nil {
		t.Fatal(err)
	}
	var ops []map[string]any
	if err := json.Unmarshal(out.Response.Patch, &ops); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"op": "add", "path": "/metadata/annotations", "value": map[string]any{AnnotationRaw: `{"allocatable":{"cpu":"3500m"},"capacity":{"cpu":"4"}}`}},
		{"op": "replace", "path": "/status/allocatable/cpu", "value": "7"},
		{"op": "replace", "path": "/status/capacity/cpu", "value": "7500m"},
	}
	if len(ops) != len(want) {
		t.Fatalf("patch %s, want %v", out.Response.Patch, want)
	}
	for _, w := range want {
		found := false
		for _, op := range ops {
			if reflect.DeepEqual(op, w) {
				found = true
			}
		}
		if !found {
			t.Errorf("patch %s lacks %v", out.Response.Patch, w)
		}
	}
	for _, s := range []string{`"creationTimestamp":null`, `"futureField":[1,2.50,1e3]`, `"n":12345678901234567890`, `"a":"<b>"`} {
		if !strings.Contains(string(out.Object), s) {
			t.Errorf("mutated node lost %s: %s", s, out.Object)
		}
	}
}

func TestMutateBadObject(t *testing.T) {
	_, w := newWebhooks(t, DefaultConfig())
	for _, raw := range []string{`{"status":`, `{"status":{"capacity":{"cpu":"lots"}}}`, `[]`} {
		out, err := w.mutate.Review(context.Background(), request(admissionv1.Create, "", raw, ""))
		if err != nil {
			t.Fatal(err)
		}
		r := out.Response
		if r.Allowed || r.Result.Code != 400 || !strings.HasPrefix(r.Result.Message, "node-overcommit: cannot parse the node: ") {
			t.Errorf("%s: response %+v", raw, r.Result)
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name         string
		op           admissionv1.Operation
		annotations  map[string]string
		old          map[string]string // annotations of the old object on UPDATE
		code         int32             // 0: allowed
		message      string
		wantWarnings []string
	}{
		{name: "no annotation", op: admissionv1.Create},
		{name: "other annotations", op: admissionv1.Create, annotations: map[string]string{"a": "b"}},
		{name: "valid override", op: admissionv1.Create, annotations: map[string]string{AnnotationRatio: `{"cpu":"1.5"}`}},
		{name: "bounds are inclusive", op: admissionv1.Update, annotations: map[string]string{AnnotationRatio: `{"cpu":"1","memory":"4"}`},
			wantWarnings: []string{`annotation kadmit.io/overcommit-ratio: "memory" is not an overcommitted resource; ignored`}},
		{name: "empty object", op: admissionv1.Create, annotations: map[string]string{AnnotationRatio: `{}`}},
		{name: "ratio below 1", op: admissionv1.Create, annotations: map[string]string{AnnotationRatio: `{"cpu":"0.5"}`}, code: 400,
			message: `annotation kadmit.io/overcommit-ratio: ratio for "cpu" must be a decimal in [1, 4], got "0.5"`},
		{name: "ratio above max", op: admissionv1.Update, annotations: map[string]string{AnnotationRatio: `{"cpu":"4.5"}`}, code: 400,
			message: `annotation kadmit.io/overcommit-ratio: ratio for "cpu" must be a decimal in [1, 4], got "4.5"`},
		{name: "first bad resource in name order", op: admissionv1.Create, annotations: map[string]string{AnnotationRatio: `{"pods":"0","memory":"x"}`}, code: 400,
			message: `annotation kadmit.io/overcommit-ratio: ratio for "memory" must be a decimal in [1, 4], got "x"`},
		{name: "number instead of string", op: admissionv1.Create, annotations: map[string]string{AnnotationRatio: `{"cpu":1.5}`}, code: 400,
			message: `annotation kadmit.io/overcommit-ratio: must be a JSON object of resource name to decimal string like {"cpu":"1.5"}: json: cannot unmarshal number`},
		{name: "not JSON", op: admissionv1.Create, annotations: map[string]string{AnnotationRatio: `cpu=2`}, code: 400,
			message: `annotation kadmit.io/overcommit-ratio: must be a JSON object of resource name to decimal string like {"cpu":"1.5"}: invalid character`},
		{name: "null", op: admissionv1.Create, annotations: map[string]string{AnnotationRatio: `null`}, code: 400,
			message: `annotation kadmit.io/overcommit-ratio: must be a JSON object of resource name to decimal string like {"cpu":"1.5"}: got null`},
		{name: "empty value", op: admissionv1.Create, annotations: map[string]string{AnnotationRatio: ``}, code: 400,
			message: `annotation kadmit.io/overcommit-ratio: must be a JSON object`},
		{name: "empty resource name", op: admissionv1.Create, annotations: map[string]string{AnnotationRatio: `{"":"2"}`}, code: 400,
			message: `annotation kadmit.io/overcommit-ratio: resource name must not be empty`},
		{name: "update introducing a bad value", op: admissionv1.Update, annotations: map[string]string{AnnotationRatio: `{"cpu":"9"}`},
			old: map[string]string{AnnotationRatio: `{"cpu":"2"}`}, code: 400,
			message: `annotation kadmit.io/overcommit-ratio: ratio for "cpu" must be a decimal in [1, 4], got "9"`},
		{name: "update keeping a bad value is only warned", op: admissionv1.Update, annotations: map[string]string{AnnotationRatio: `{"cpu":"9"}`},
			old:          map[string]string{AnnotationRatio: `{"cpu":"9"}`},
			wantWarnings: []string{`annotation kadmit.io/overcommit-ratio is ignored: ratio for "cpu" must be a decimal in [1, 4], got "9"`}},
		{name: "create is never excused", op: admissionv1.Create, annotations: map[string]string{AnnotationRatio: ``},
			old: map[string]string{AnnotationRatio: ``}, code: 400, message: `annotation kadmit.io/overcommit-ratio: must be a JSON object`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, w := newWebhooks(t, DefaultConfig())
			capacity := map[string]string{"cpu": "4"}
			old := ""
			if tt.old != nil {
				old = node(t, tt.old, capacity, capacity)
			}
			out, err := w.validate.Review(context.Background(), request(tt.op, "", node(t, tt.annotations, capacity, capacity), old))
			if err != nil {
				t.Fatal(err)
			}
			r := out.Response
			if r.Patch != nil {
				t.Fatalf("validating hook patched: %s", r.Patch)
			}
			if len(r.Warnings) != len(tt.wantWarnings) {
				t.Fatalf("warnings = %q, want %q", r.Warnings, tt.wantWarnings)
			}
			// Review's warnings are whole: the cut to admission.MaxWarningLength
			// happens when the response is encoded, so any difference is a bug.
			for i, want := range tt.wantWarnings {
				if r.Warnings[i] != want {
					t.Errorf("warning %q, want %q", r.Warnings[i], want)
				}
			}
			if tt.code == 0 {
				if !r.Allowed {
					t.Fatalf("denied: %+v", r.Result)
				}
				return
			}
			if r.Allowed || r.Result.Code != tt.code || out.Policy != Name {
				t.Fatalf("response %+v, want code %d", r.Result, tt.code)
			}
			if !strings.HasPrefix(r.Result.Message, tt.message) {
				t.Fatalf("message %q, want prefix %q", r.Result.Message, tt.message)
			}
		})
	}
}

func TestValidateBadObject(t *testing.T) {
	_, w := newWebhooks(t, DefaultConfig())
	out, err := w.validate.Review(context.Background(), request(admissionv1.Create, "", `{"metadata":{"annotations":[]}}`, ""))
	if err != nil {
		t.Fatal(err)
	}
	if r := out.Response; r.Allowed || r.Result.Code != 400 || !strings.HasPrefix(r.Result.Message, "node-overcommit: cannot parse the node: ") {
		t.Fatalf("response %+v", r.Result)
	}
}

// TestOutOfRangeQuantities: /validate-node refuses (400) an out-of-range
// status quantity or raw-allocatable value naming the field, but on UPDATE
// only warns when the old node already carried it; /mutate-node-status
// refuses the status value and warns about the annotation.
func TestOutOfRangeQuantities(t *testing.T) {
	_, w := newWebhooks(t, DefaultConfig())
	bad := `{"metadata":{"name":"n"},"status":{"capacity":{"cpu":"4","memory":"-1e9999999"},"allocatable":{"cpu":"4"}}}`
	good := `{"metadata":{"name":"n"},"status":{"capacity":{"cpu":"4"},"allocatable":{"cpu":"4"}}}`
	const msg = "status.capacity.memory: quantity -1e9999999 is out of range (|value| must be below 9223372036854775807m)"
	review := func(wh *admission.Webhook, r *admission.Request) *admissionv1.AdmissionResponse {
		t.Helper()
		out, err := wh.Review(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		return out.Response
	}
	if r := review(w.validate, request(admissionv1.Create, "", bad, "")); r.Allowed || r.Result.Code != 400 || r.Result.Message != "node-overcommit: "+msg {
		t.Errorf("create: %+v", r.Result)
	}
	if r := review(w.validate, request(admissionv1.Update, "", bad, good)); r.Allowed || r.Result.Code != 400 {
		t.Errorf("update introducing it: %+v", r.Result)
	}
	if r := review(w.validate, request(admissionv1.Update, "", bad, bad)); !r.Allowed || len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "status.capacity.memory") {
		t.Errorf("update keeping it: allowed %v, warnings %q", r.Allowed, r.Warnings)
	}
	if r := review(w.mutate, request(admissionv1.Update, "status", bad, good)); r.Allowed || r.Result.Code != 400 || !strings.Contains(r.Result.Message, msg) {
		t.Errorf("mutate: %+v", r.Result)
	}
	annotated := `{"metadata":{"name":"n","annotations":{"kadmit.io/raw-allocatable":"{\"allocatable\":{\"cpu\":\"1e9999999\"},\"capacity\":{\"cpu\":\"4\"}}"}},"status":{"capacity":{"cpu":"4"},"allocatable":{"cpu":"4"}}}`
	if r := review(w.validate, request(admissionv1.Create, "", annotated, "")); r.Allowed || r.Result.Code != 400 || !strings.Contains(r.Result.Message, "kadmit.io/raw-allocatable: allocatable.cpu: quantity 1e9999999 is out of range") {
		t.Errorf("validate annotation: %+v", r.Result)
	}
	r := review(w.mutate, request(admissionv1.Update, "status", annotated, good))
	if !r.Allowed || len(r.Warnings) != 1 || r.Warnings[0] != "annotation kadmit.io/raw-allocatable ignored: allocatable.cpu is out of range" {
		t.Errorf("mutate annotation: allowed %v, warnings %q", r.Allowed, r.Warnings)
	}
}
