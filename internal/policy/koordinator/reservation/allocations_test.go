package reservation

import (
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
)

func reservationU(name, phase string, allocatable, allocated map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/" + Version, "kind": "Reservation",
		"metadata": map[string]any{"name": name},
		"status":   map[string]any{"phase": phase, "allocatable": allocatable, "allocated": allocated},
	}}
	return u
}

func TestCheckAllocations(t *testing.T) {
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	for _, u := range []*unstructured.Unstructured{
		reservationU("r1", "Available", map[string]any{"cpu": "4", "memory": "8Gi"}, map[string]any{"cpu": "3"}),
		reservationU("pending", "Pending", map[string]any{"cpu": "4"}, nil),
		reservationU("broken", "Available", map[string]any{"cpu": "1e9999999"}, nil),
	} {
		if err := store.Add(u); err != nil {
			t.Fatal(err)
		}
	}
	p, err := New(Config{CheckAllocations: true}, nil, reservationStore{store})
	if err != nil {
		t.Fatal(err)
	}
	pod := func(affinity, cpu string) string {
		return `{"metadata":{"annotations":{"scheduling.koordinator.sh/reservation-affinity":` + affinity +
			`}},"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"` + cpu + `","memory":"1Gi"}}}]}}`
	}
	for _, c := range []struct {
		name string
		op   admissionv1.Operation
		raw  string
		code int32 // 0: allowed
		msg  string
	}{
		{"no affinity", admissionv1.Create, `{"spec":{"containers":[{"name":"c"}]}}`, 0, ""},
		{"selector only", admissionv1.Create, pod(`"{\"reservationSelector\":{\"a\":\"b\"}}"`, "100"), 0, ""},
		{"fits", admissionv1.Create, pod(`"{\"name\":\"r1\"}"`, "1"), 0, ""},
		{"exceeds", admissionv1.Create, pod(`"{\"name\":\"r1\"}"`, "1500m"), 403, `reservation: pod requests cpu 1500m, Reservation "r1" has 1 of 4 left`},
		{"missing", admissionv1.Create, pod(`"{\"name\":\"nope\"}"`, "1"), 403, `Reservation "nope" named by scheduling.koordinator.sh/reservation-affinity does not exist`},
		{"pending", admissionv1.Create, pod(`"{\"name\":\"pending\"}"`, "1"), 403, `Reservation "pending" is "Pending", not Available`},
		{"malformed", admissionv1.Create, pod(`"{"`, "1"), 400, "annotation scheduling.koordinator.sh/reservation-affinity"},
		{"huge", admissionv1.Create, pod(`"`+strings.Repeat(" ", maxAffinityBytes+1)+`"`, "1"), 400, "more than"},
		{"bad cached quantity", admissionv1.Create, pod(`"{\"name\":\"broken\"}"`, "1"), 500, "status.allocatable.cpu"},
		{"UPDATE is not checked", admissionv1.Update, pod(`"{\"name\":\"nope\"}"`, "1"), 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := req(c.op, "pods", []byte(c.raw))
			r.Resource = metav1.GroupVersionResource{Version: "v1", Resource: "pods"}
			v := p.Validate(t.Context(), r)
			if (c.code == 0) != v.Allowed || (c.code != 0 && (v.Code != c.code || !strings.Contains(v.Message, c.msg))) {
				t.Fatalf("verdict %+v, want %d %q", v, c.code, c.msg)
			}
		})
	}
	// Offline: admitted with a warning.
	off, _ := New(Config{CheckAllocations: true}, nil, nil)
	r := req(admissionv1.Create, "pods", []byte(pod(`"{\"name\":\"r1\"}"`, "9")))
	if v := off.Validate(t.Context(), r); !v.Allowed || len(v.Warnings) != 1 {
		t.Fatalf("offline: %+v", v)
	}
	// Off by default: nothing is checked.
	def, _ := New(Config{}, nil, reservationStore{store})
	if v := def.Validate(t.Context(), req(admissionv1.Create, "pods", []byte(pod(`"{\"name\":\"nope\"}"`, "1")))); !v.Allowed {
		t.Fatalf("default config: %+v", v)
	}
}

func TestCaches(t *testing.T) {
	if got := Definition.Caches(Config{}); len(got) != 0 {
		t.Fatalf("default caches %v", got)
	}
	got := Definition.Caches(Config{CheckAllocations: true})
	if len(got) != 1 || got[0].Resource != Reservations || len(got[0].Fields) == 0 {
		t.Fatalf("caches %v", got)
	}
}
