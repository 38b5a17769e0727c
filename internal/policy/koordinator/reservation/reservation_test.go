package reservation

import (
	"encoding/json"
	"fmt"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/koordinator/colocation"
	"github.com/kadmit/kadmit/internal/policy/policytest"
	"github.com/kadmit/kadmit/internal/testkit"
)

// reservationObj is the part of Koordinator's Reservation
// (apis/scheduling/v1alpha1/reservation_types.go) the differential check
// decodes: metadata and the pod template, the rest kept as it is.
type reservationObj struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Template *corev1.PodTemplateSpec `json:"template,omitempty"`
		Owners   []json.RawMessage       `json:"owners,omitempty"`
		TTL      *metav1.Duration        `json:"ttl,omitempty"`
	} `json:"spec"`
}

type fakeClasses map[string]int32

var fakePreemption = corev1.PreemptionPolicy("fakePreemptionPolicy")

func (f fakeClasses) PriorityClass(name string) (int32, *corev1.PreemptionPolicy, error) {
	v, ok := f[name]
	if !ok {
		return 0, nil, apierrors.NewNotFound(schema.GroupResource{Group: "scheduling.k8s.io", Resource: "priorityclasses"}, name)
	}
	pp := fakePreemption
	return v, &pp, nil
}

func req(op admissionv1.Operation, resource string, raw []byte) *admission.Request {
	return testkit.Request(op, metav1.GroupVersionResource{Group: Group, Version: Version, Resource: resource}, raw, nil)
}

func q(s string) resource.Quantity { return resource.MustParse(s) }
func p32(v int32) *int32           { return &v }

// upstreamReservation is the input of upstream's cases
// (pkg/webhook/reservation/mutating/cluster_colocation_profile_test.go:74-109).
func upstreamReservation() *reservationObj {
	r := &reservationObj{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "test-reservation-1",
		Labels: map[string]string{"koordinator-colocation-reservation": "true"}}}
	r.Spec.Template = &corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "test-container-a", Resources: corev1.ResourceRequirements{
			Limits:   corev1.ResourceList{"cpu": q("1"), "memory": q("4Gi")},
			Requests: corev1.ResourceList{"cpu": q("1"), "memory": q("4Gi")}}}},
		Overhead:      corev1.ResourceList{"cpu": q("1"), "memory": q("2Gi")},
		SchedulerName: "nonExistSchedulerName",
	}}
	return r
}

func selected() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"koordinator-colocation-reservation": "true"}}
}

// TestUpstreamMutatingTable carries over the facts of
// TestClusterColocationProfileMutatingReservation (lines 61-975): the same
// Reservations, profiles and expected Reservations, without the profiles'
// strategic merge patch (kadmit has none; docs/policies.md). The fake
// cluster has PriorityClass koordinator-prod with value 9500
// (PriorityProdValueDefault) and the fake preemption policy.
func TestUpstreamMutatingTable(t *testing.T) {
	pct := func(n int32) *intstr.IntOrString { v := intstr.FromInt32(n); return &v }
	prodApplied := func(r *reservationObj) {
		r.Labels["testLabelA"] = "valueA"
		r.Labels["koordinator.sh/qosClass"] = "LS"
		r.Labels["koordinator.sh/priority"] = "1111"
		r.Annotations = map[string]string{"testAnnotationA": "valueA"}
		s := &r.Spec.Template.Spec
		s.SchedulerName, s.PriorityClassName, s.Priority = "koordinator-scheduler", "koordinator-prod", p32(9500)
		pp := fakePreemption
		s.PreemptionPolicy = &pp
	}
	beApplied := func(r *reservationObj) {
		r.Labels["testLabelA"] = "valueA"
		r.Labels["koordinator.sh/qosClass"] = "BE"
		r.Labels["koordinator.sh/priority"] = "1111"
		r.Annotations = map[string]string{"testAnnotationA": "valueA"}
		r.Spec.Template.Spec.SchedulerName = "koordinator-scheduler"
	}
	prodProfile := colocation.Profile{Name: "test-profile", Selector: selected(),
		Labels: map[string]string{"testLabelA": "valueA"}, Annotations: map[string]string{"testAnnotationA": "valueA"},
		SchedulerName: "koordinator-scheduler", KoordinatorPriority: p32(1111), PriorityClassName: "koordinator-prod", QoSClass: "LS"}
	beProfile := func(p *intstr.IntOrString) colocation.Profile {
		return colocation.Profile{Name: "test-profile", Selector: selected(), Probability: p,
			Labels: map[string]string{"testLabelA": "valueA"}, Annotations: map[string]string{"testAnnotationA": "valueA"},
			SchedulerName: "koordinator-scheduler", QoSClass: "BE", KoordinatorPriority: p32(1111)}
	}
	advanced := func(suffixes bool) colocation.Profile {
		p := colocation.Profile{Name: "test-profile", Selector: selected(),
			Labels:                map[string]string{"testLabelA": "valueA", "koordinator.sh/scheduler-name": "koordinator-scheduler"},
			LabelKeysMapping:      map[string]string{"label-key-to-load": "label-key-to-store"},
			Annotations:           map[string]string{"testAnnotationA": "valueA"},
			AnnotationKeysMapping: map[string]string{"annotation-key-to-load": "annotation-key-to-store"},
			QoSClass:              "BE", KoordinatorPriority: p32(1111)}
		if suffixes {
			p.LabelSuffixes = map[string]string{"label-key-1": "suffix", "label-key-to-store": "suffix-0", "suffix-label-key-1": "suffix-1"}
		}
		return p
	}
	advancedIn := func(r *reservationObj) {
		r.Labels["label-key-to-load"] = "test-label-value"
		r.Annotations = map[string]string{"testAnnotationA": "valueA", "annotation-key-to-load": "test-annotation-value"}
	}
	advancedWant := func(store string) func(r *reservationObj) {
		return func(r *reservationObj) {
			r.Labels["testLabelA"] = "valueA"
			r.Labels["label-key-to-store"] = store
			r.Labels["koordinator.sh/qosClass"] = "BE"
			r.Labels["koordinator.sh/priority"] = "1111"
			r.Labels["koordinator.sh/scheduler-name"] = "koordinator-scheduler"
			r.Annotations["annotation-key-to-store"] = "test-annotation-value"
		}
	}
	emptySel := prodProfile
	emptySel.Selector = &metav1.LabelSelector{}
	for _, c := range []struct {
		name    string
		in      func(*reservationObj)
		profile colocation.Profile
		rand    int
		want    func(*reservationObj)
		wantErr string
	}{
		{name: "mutating reservation", profile: prodProfile, want: prodApplied},
		{name: "mutating reservation 1", in: func(r *reservationObj) { r.Labels = nil }, profile: emptySel,
			want: func(r *reservationObj) { r.Labels = map[string]string{}; prodApplied(r) }},
		{name: "mutating reservation, percent 100", profile: beProfile(pct(100)), want: beApplied},
		{name: "mutating reservation, percent 0", profile: beProfile(pct(0)), want: func(*reservationObj) {}},
		{name: "mutating reservation, percent 50, rand=30", profile: beProfile(pct(50)), rand: 30, want: beApplied},
		{name: "mutate advanced attributes", in: advancedIn, profile: advanced(false), want: advancedWant("test-label-value")},
		{name: "mutate advanced attributes 1", in: advancedIn, profile: advanced(true), want: advancedWant("test-label-valuesuffix-0")},
		{name: "mutating failed", profile: colocation.Profile{Name: "test-profile", Selector: selected(), PriorityClassName: "unknown-priority-class"},
			wantErr: `priorityclasses.scheduling.k8s.io "unknown-priority-class" not found`},
		// kadmit's own: without spec.template the spec fields are left alone
		// (cluster_colocation_profile.go:180, 191).
		{name: "no template", in: func(r *reservationObj) { r.Spec.Template = nil }, profile: prodProfile,
			want: func(r *reservationObj) {
				r.Labels["testLabelA"] = "valueA"
				r.Labels["koordinator.sh/qosClass"] = "LS"
				r.Labels["koordinator.sh/priority"] = "1111"
				r.Annotations = map[string]string{"testAnnotationA": "valueA"}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := upstreamReservation()
			if c.in != nil {
				c.in(in)
			}
			p, err := New(Config{Profiles: []colocation.Profile{c.profile}}, fakeClasses{"koordinator-prod": 9500}, nil)
			if err != nil {
				t.Fatal(err)
			}
			p.profiles.SetRandForTest(func(int) int { return c.rand })
			raw, _ := json.Marshal(in)
			ops, v := p.Mutate(t.Context(), req(admissionv1.Create, Resource, raw))
			if c.wantErr != "" {
				if v.Allowed || v.Code != 500 || v.Message != c.wantErr || len(ops) != 0 {
					t.Fatalf("verdict %+v ops %v, want 500 %q", v, ops, c.wantErr)
				}
				return
			}
			if !v.Allowed {
				t.Fatalf("denied: %+v", v)
			}
			policytest.Check(t, raw, ops, func(r *reservationObj) { c.want(r) })
		})
	}
}

// TestUpstreamHandlerTable carries over TestMutatingHandler
// (pkg/webhook/reservation/mutating/mutating_handler_test.go:75-206): two
// profiles selecting koordinator-colocation-reservation=true.
func TestUpstreamHandlerTable(t *testing.T) {
	p, err := New(Config{Profiles: []colocation.Profile{
		{Name: "test-profile", Selector: selected(), Labels: map[string]string{"foo": "bar"}},
		{Name: "test-profile-1", Selector: selected(), Labels: map[string]string{"foo-1": "bar-1"}},
	}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		r        *admission.Request
		allowed  bool
		code     int32
		patched  string
		patchNil bool
	}{
		{name: "not a reservation", r: req(admissionv1.Create, "configmaps", nil), allowed: true, patchNil: true},
		{name: "reservation with subresource", r: func() *admission.Request {
			r := req(admissionv1.Create, Resource, nil)
			r.SubResource = "status"
			return r
		}(), allowed: true, patchNil: true},
		{name: "reservation with empty object", r: req(admissionv1.Create, Resource, nil), code: 400},
		{name: "reservation not create", r: req(admissionv1.Update, Resource, []byte(`{"metadata":{"name":"reservation1"}}`)), allowed: true, patchNil: true},
		{name: "reservation with object unmatched", r: req(admissionv1.Create, Resource,
			[]byte(`{"metadata":{"name":"reservation1", "labels": {"koordinator-colocation-reservation": "false"}}}`)), allowed: true, patchNil: true},
		{name: "reservation with object matched", r: req(admissionv1.Create, Resource,
			[]byte(`{"metadata":{"name":"reservation1", "labels": {"koordinator-colocation-reservation": "true"}}}`)), allowed: true,
			patched: `{"metadata":{"name":"reservation1","labels":{"foo":"bar","foo-1":"bar-1","koordinator-colocation-reservation":"true"}}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, v := policytest.Mutate(t, p, c.r)
			if v.Allowed != c.allowed || (!c.allowed && v.Code != c.code) {
				t.Fatalf("verdict %+v, want allowed=%v code %d", v, c.allowed, c.code)
			}
			if c.patchNil && out != nil {
				t.Fatalf("patched %s", out)
			}
			if c.patched != "" {
				var got, want any
				_ = json.Unmarshal(out, &got)
				_ = json.Unmarshal([]byte(c.patched), &want)
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("patched %s\nwant %s", out, c.patched)
				}
			}
		})
	}
}

// TestUpstreamReservePodAnnotation carries over TestClusterReservationValidatingPod
// (pkg/webhook/pod/validating/verify_annotations_test.go:37-104), plus the
// UPDATE and other-annotation cases of the same rule.
func TestUpstreamReservePodAnnotation(t *testing.T) {
	p, _ := New(Config{}, nil, nil)
	const reason = `annotations.scheduling.koordinator.sh/reserve-pod: Forbidden: cannot set in annotations`
	for _, c := range []struct {
		name string
		op   admissionv1.Operation
		pod  string
		deny bool
	}{
		{"forbidden resources annotations", admissionv1.Create, `{"metadata":{"annotations":{"scheduling.koordinator.sh/reserve-pod":""}}}`, true},
		{"any value, on UPDATE", admissionv1.Update, `{"metadata":{"annotations":{"scheduling.koordinator.sh/reserve-pod":"true"}}}`, true},
		{"other annotations", admissionv1.Create, `{"metadata":{"annotations":{"scheduling.koordinator.sh/reservation-affinity":"{}"}}}`, false},
		{"no annotations", admissionv1.Create, `{"metadata":{"name":"p"}}`, false},
		{"DELETE is not checked", admissionv1.Delete, `{"metadata":{"annotations":{"scheduling.koordinator.sh/reserve-pod":""}}}`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := req(c.op, "pods", []byte(c.pod))
			r.Resource = metav1.GroupVersionResource{Version: "v1", Resource: "pods"}
			v := p.Validate(t.Context(), r)
			if c.deny != !v.Allowed || (c.deny && (v.Code != 400 || v.Message != reason)) {
				t.Fatalf("verdict %+v, deny=%v", v, c.deny)
			}
		})
	}
	if v := p.Validate(t.Context(), req(admissionv1.Create, "pods", []byte(`{"metadata":{"annotations":[]}}`))); v.Allowed || v.Code != 400 {
		t.Fatalf("malformed pod: %+v", v)
	}
}
