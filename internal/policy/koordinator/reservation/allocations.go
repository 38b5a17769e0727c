package reservation

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/shared/podrequest"
	"github.com/kadmit/kadmit/internal/quantity"
)

// Reservations is the cache of Koordinator Reservations that
// checkAllocations reads.
var Reservations = clustercache.Resource{GroupVersionResource: schema.GroupVersionResource{
	Group: Group, Version: Version, Resource: Resource}, Custom: true}

// AnnotationReservationAffinity is the pod annotation that names the
// Reservation a pod wants (apis/extension/reservation.go:52, :78-92).
const AnnotationReservationAffinity = "scheduling.koordinator.sh/reservation-affinity"

// maxAffinityBytes bounds the annotation kadmit parses.
const maxAffinityBytes = 16 << 10

// ReservationState is what the allocation check needs of a Reservation.
type ReservationState struct {
	Phase                  string
	Allocatable, Allocated corev1.ResourceList
}

// ReservationLookup finds a Reservation by name; ok false when unknown.
type ReservationLookup interface {
	Reservation(name string) (ReservationState, bool, error)
}

// checkAllocations is kadmit's opt-in check (upstream v1.8.0 has none at
// admission; its scheduler's Reservation plugin decides at scheduling): a
// pod created with a reservation-affinity naming a Reservation must name an
// existing, Available one with room for its effective request in every
// resource the Reservation's status.allocatable lists
// (allocatable - allocated). Other affinity forms (selectors) are left to
// the scheduler. Offline it warns and admits.
func (p *Policy) checkAllocations(doc *jsonedit.Doc) admission.Verdict {
	var ann string
	found, err := doc.Decode(&ann, "metadata", "annotations", AnnotationReservationAffinity)
	if err != nil {
		return admission.Invalid("%s: %v", Name, err)
	}
	if !found {
		return admission.Allow()
	}
	if len(ann) > maxAffinityBytes {
		return admission.Invalid("%s: annotation %s is %d bytes, more than %d", Name, AnnotationReservationAffinity, len(ann), maxAffinityBytes)
	}
	var aff struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal([]byte(ann), &aff); err != nil {
		return admission.Invalid("%s: annotation %s: %v", Name, AnnotationReservationAffinity, err)
	}
	if aff.Name == "" {
		return admission.Allow()
	}
	if p.reservations == nil {
		return admission.Allow(fmt.Sprintf("%s: Reservations unknown offline; %q not checked", Name, shortName(aff.Name)))
	}
	r, ok, err := p.reservations.Reservation(aff.Name)
	if err != nil {
		return admission.Errored(0, fmt.Errorf("%s: Reservation %q: %w", Name, shortName(aff.Name), err))
	}
	if !ok {
		return admission.Deny("%s: Reservation %q named by %s does not exist", Name, shortName(aff.Name), AnnotationReservationAffinity)
	}
	if r.Phase != "Available" {
		return admission.Deny("%s: Reservation %q is %q, not Available", Name, shortName(aff.Name), r.Phase)
	}
	raw, err := doc.Get("spec")
	if err != nil {
		return admission.Invalid("%s: %v", Name, err)
	}
	spec, err := podrequest.DecodeSpec(raw, "spec")
	if err != nil {
		return admission.Invalid("%s: %v", Name, err)
	}
	req := podrequest.Effective(spec)
	for _, name := range slices.Sorted(maps.Keys(r.Allocatable)) {
		want, ok := req[name]
		if !ok || want.Sign() <= 0 {
			continue
		}
		total := r.Allocatable[name]
		left := total.DeepCopy()
		if used, ok := r.Allocated[name]; ok {
			left.Sub(used)
		}
		if want.Cmp(left) > 0 {
			return admission.Deny("%s: pod requests %s %s, Reservation %q has %s of %s left",
				Name, name, want.String(), shortName(aff.Name), left.String(), total.String())
		}
	}
	return admission.Allow()
}

func shortName(s string) string {
	if len(s) > 63 {
		return s[:63] + "..."
	}
	return s
}

// reservationStore reads Reservations from the dynamic informer's store.
type reservationStore struct{ store cache.Store }

// Reservation implements ReservationLookup; quantities are bounded by
// internal/quantity, and a malformed one is an error.
func (s reservationStore) Reservation(name string) (ReservationState, bool, error) {
	obj, exists, err := s.store.GetByKey(name)
	if err != nil || !exists {
		return ReservationState{}, false, err
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return ReservationState{}, false, fmt.Errorf("cached object is %T", obj)
	}
	var st ReservationState
	st.Phase, _, _ = unstructured.NestedString(u.Object, "status", "phase")
	for _, f := range []struct {
		field string
		dst   *corev1.ResourceList
	}{{"allocatable", &st.Allocatable}, {"allocated", &st.Allocated}} {
		m, _, err := unstructured.NestedMap(u.Object, "status", f.field)
		if err != nil {
			return st, false, fmt.Errorf("status.%s: %w", f.field, err)
		}
		*f.dst = corev1.ResourceList{}
		for k, v := range m {
			q, err := quantity.Parse(fmt.Sprint(v))
			if err != nil {
				return st, false, fmt.Errorf("status.%s.%s: %w", f.field, k, err)
			}
			(*f.dst)[corev1.ResourceName(k)] = q
		}
	}
	return st, true, nil
}
