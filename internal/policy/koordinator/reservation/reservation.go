// Package reservation implements kadmit's version of Koordinator's
// Reservation webhooks (koordinator-sh/koordinator v1.8.0): the
// /mutate-reservation webhook that applies colocation profiles to a
// Reservation being created (pkg/webhook/reservation/mutating/) and the pod
// rule that no one may set the scheduling.koordinator.sh/reserve-pod
// annotation (pkg/webhook/pod/validating/verify_annotations.go).
package reservation

import (
	"context"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/koordinator/colocation"
	"github.com/kadmit/kadmit/internal/policy/koordinator/reservepod"
)

// Name is the policy's name (policies.reservation in the configuration).
const Name = "reservation"

// Paths: /mutate-reservation is the policy's own; /validate-pod is shared.
const (
	MutatePath   = "/mutate-reservation"
	ValidatePath = "/validate-pod"
)

// AnnotationReservePod marks the scheduler's in-memory reserve pods; a
// user may not set it (package reservepod holds the ban).
const AnnotationReservePod = reservepod.Annotation

// Group, Version and Resource of Koordinator's Reservation (cluster-scoped).
const (
	Group    = "scheduling.koordinator.sh"
	Version  = "v1alpha1"
	Resource = "reservations"
)

// Config is the reservation policy's configuration (policies.reservation).
type Config struct {
	// Profiles are the colocation profiles applied to Reservations, in name
	// order: upstream applies the same ClusterColocationProfiles to pods and
	// Reservations, and a YAML anchor shares one list with
	// policies.colocation.profiles. namespaceSelector is ignored, as
	// upstream does (cluster_colocation_profile.go:69), and so are the pod
	// resource switches (upstream's line 101: no resource translation).
	Profiles []colocation.Profile `json:"profiles,omitempty"`
	// RecordProfiles (kadmit, off by default) lists the applied profiles in
	// the kadmit.io/colocation-profiles annotation.
	RecordProfiles bool `json:"recordProfiles,omitempty"`
	// CheckAllocations (kadmit, off by default; upstream checks nothing at
	// admission) refuses a pod at CREATE whose reservation-affinity names a
	// Reservation that does not exist, is not Available, or lacks room for
	// the pod's request. It reads Reservations from the cluster cache.
	CheckAllocations bool `json:"checkAllocations,omitempty"`
}

// DefaultConfig is the seed profile: disabled, no profiles.
func DefaultConfig() Config { return Config{} }

// Validate reports the first problem as "<field>: <problem>".
func (c Config) Validate() error { return colocation.ValidateProfiles(c.Profiles) }

var (
	_ admission.Mutator   = (*Policy)(nil)
	_ admission.Validator = (*Policy)(nil)
)

// Policy is the reservation policy.
type Policy struct {
	cfg          Config
	profiles     *colocation.Profiles
	classes      colocation.PriorityClasses
	reservations ReservationLookup
}

// New validates cfg and builds the policy; classes nil is offline (see
// colocation.Profiles.Apply), and so is reservations nil (checkAllocations
// then warns and admits).
func New(cfg Config, classes colocation.PriorityClasses, reservations ReservationLookup) (*Policy, error) {
	ps, err := colocation.CompileProfiles(cfg.Profiles)
	if err != nil {
		return nil, err
	}
	return &Policy{cfg: cfg, profiles: ps, classes: classes, reservations: reservations}, nil
}

// Hooks returns the mutating hook (Reservations CREATE on
// /mutate-reservation, pkg/webhook/reservation/mutating/webhooks.go:27) and
// the validating hook (pods CREATE and UPDATE on /validate-pod,
// pkg/webhook/pod/validating/webhooks.go:28), both failurePolicy Fail.
func (p *Policy) Hooks() []admission.Hook {
	return []admission.Hook{{
		Policy: Name, Path: MutatePath, Type: admission.Mutating,
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{Group}, APIVersions: []string{Version}, Resources: []string{Resource}},
		}},
		FailurePolicy: admissionregistrationv1.Fail,
		Mutator:       p,
	}, {
		Policy: Name, Path: ValidatePath, Type: admission.Validating,
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
		}},
		FailurePolicy: admissionregistrationv1.Fail,
		Validator:     p,
	}}
}

// Mutate is clusterColocationProfileMutatingReservation
// (pkg/webhook/reservation/mutating/cluster_colocation_profile.go:51-103):
// on CREATE, the profiles whose selector matches the Reservation's labels
// apply in name order to its metadata and, when it has spec.template, to
// the template's schedulerName and priority class
// (doMutateByColocationProfile, lines 132-223). Only what the profiles
// read is decoded. An unreadable Reservation is refused with 400, a failed
// PriorityClass lookup with 500 (mutaing_handler.go:64-80).
func (p *Policy) Mutate(_ context.Context, req *admission.Request) ([]jsonedit.Op, admission.Verdict) {
	if req.Operation != admissionv1.Create || req.SubResource != "" || req.Resource.Resource != Resource {
		return nil, admission.Allow()
	}
	doc := req.ObjectDoc()
	have, err := colocation.ReadObject(doc, colocation.TemplateSpec)
	if err != nil {
		return nil, admission.Invalid("%s: cannot parse the Reservation: %v", Name, err)
	}
	if p.profiles.Len() == 0 {
		return nil, admission.Allow()
	}
	// A Reservation has no namespace: namespaceSelector plays no part.
	res, err := p.profiles.Apply(have, nil, p.classes)
	if err != nil {
		return nil, admission.Errored(0, err)
	}
	if !res.Matched {
		return nil, admission.Allow()
	}
	if p.cfg.RecordProfiles {
		res.RecordApplied()
	}
	if err := colocation.Write(doc, colocation.TemplateSpec, have, res.Want); err != nil {
		return nil, admission.Invalid("%s: cannot edit the Reservation: %v", Name, err)
	}
	return doc.Ops(), admission.Allow(res.Warnings...)
}

// Validate is clusterReservationValidatingPod
// (pkg/webhook/pod/validating/verify_annotations.go:30-76, package
// reservepod): a pod, at CREATE or UPDATE, may not carry the reserve-pod
// annotation. With checkAllocations, a pod CREATE is then checked against
// the Reservation it names (checkAllocations).
func (p *Policy) Validate(_ context.Context, req *admission.Request) admission.Verdict {
	if v := reservepod.Validate(req); !v.Allowed {
		return v
	}
	if p.cfg.CheckAllocations && req.Operation == admissionv1.Create && req.SubResource == "" {
		return p.checkAllocations(req.ObjectDoc())
	}
	return admission.Allow()
}
