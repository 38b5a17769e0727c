// Package nodeovercommit implements the node-overcommit policy: it inflates
// the allocatable resources nodes report so the scheduler packs more pods on
// them than their requests would allow, for workloads whose requests are known
// to be pessimistic. The kubelet keeps posting its real (raw) values, so the
// policy amplifies them on every node status write, remembering the raw values
// in an annotation to stay idempotent.
package nodeovercommit

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"gopkg.in/inf.v0"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/shared/rawallocatable"
)

// Name is the policy's name in the configuration (policies.node-overcommit)
// and in the webhook registration (node-overcommit.kadmit.io).
const Name = "node-overcommit"

const (
	// MutatePath is the URL path of the mutating hook (nodes CREATE,
	// nodes/status UPDATE).
	MutatePath = "/mutate-node-status"
	// ValidatePath is the URL path of the validating hook (nodes CREATE,
	// UPDATE).
	ValidatePath = "/validate-node"
)

const (
	// AnnotationRaw records the kubelet's raw values of the amplified
	// resources, as JSON {"allocatable":{"cpu":"3500m"},"capacity":{"cpu":"4"}}
	// (package rawallocatable).
	AnnotationRaw = rawallocatable.Annotation
	// AnnotationRatio overrides the configured ratios on one node, as a JSON
	// object of resource name to decimal string: {"cpu":"1.5","memory":"1.2"}.
	AnnotationRatio = "kadmit.io/overcommit-ratio"
)

// Config is the node-overcommit policy's configuration
// (policies.node-overcommit).
type Config struct {
	// Ratios maps each resource to amplify to its ratio, a decimal string in
	// [1, MaxRatio] ("1.5"). Resources not listed are never touched, even if
	// a node's override annotation names them.
	Ratios map[corev1.ResourceName]string `json:"ratios"`
	// MaxRatio bounds every ratio, configured or from a node's annotation:
	// decimal string ≥ 1. It keeps a mistyped annotation from turning a node
	// into a black hole for pods.
	MaxRatio string `json:"maxRatio"`
}

// DefaultConfig is the seed profile: enabled, ratios {cpu: "2"}, maxRatio
// "4", failurePolicy Ignore.
func DefaultConfig() Config {
	return Config{
		Ratios:   map[corev1.ResourceName]string{corev1.ResourceCPU: "2"},
		MaxRatio: "4",
	}
}

// Validate reports the first problem in c as "<field>: <problem>", e.g.
// `ratios.cpu: must be a decimal in [1, 4], got "0.5"`; the field path is
// relative to the policy so the config loader can prefix
// "policies.node-overcommit.". Resources are checked in name order so the
// error is stable.
func (c Config) Validate() error {
	_, _, err := c.parse()
	return err
}

func (c Config) parse() (map[corev1.ResourceName]*inf.Dec, *inf.Dec, error) {
	maxRatio, err := ParseRatio(c.MaxRatio)
	if err != nil {
		return nil, nil, fmt.Errorf("maxRatio: %w", err)
	}
	if len(c.Ratios) == 0 {
		return nil, nil, errors.New("ratios: must name at least one resource")
	}
	names := slices.Sorted(maps.Keys(c.Ratios))
	ratios := make(map[corev1.ResourceName]*inf.Dec, len(names))
	for _, name := range names {
		if name == "" {
			return nil, nil, errors.New("ratios: resource name must not be empty")
		}
		r, err := parseBoundedRatio(c.Ratios[name], c.MaxRatio, maxRatio)
		if err != nil {
			return nil, nil, fmt.Errorf("ratios.%s: %w", name, err)
		}
		ratios[name] = r
	}
	return ratios, maxRatio, nil
}

// Policy amplifies node resources (mutating hook) and rejects malformed
// per-node ratio overrides (validating hook).
type Policy struct {
	cfg      Config
	ratios   map[corev1.ResourceName]*inf.Dec
	maxRatio *inf.Dec
	// resources are the configured resource names, sorted, so that the
	// mutation and its warnings do not depend on map order.
	resources []corev1.ResourceName
}

// New validates cfg and builds the policy; it returns Config.Validate's error
// unchanged so the caller can prefix the field path.
func New(cfg Config) (*Policy, error) {
	ratios, maxRatio, err := cfg.parse()
	if err != nil {
		return nil, err
	}
	p := &Policy{cfg: cfg, ratios: ratios, maxRatio: maxRatio}
	for name := range ratios {
		p.resources = append(p.resources, name)
	}
	slices.Sort(p.resources)
	return p, nil
}

// Hooks returns the mutating hook (POST /mutate-node-status: nodes CREATE,
// nodes/status UPDATE) and the validating hook (POST /validate-node: nodes
// CREATE and UPDATE), both failurePolicy Ignore unless configured otherwise:
// a kadmit outage must never keep kubelets from registering or reporting.
// The mutator skips plain nodes UPDATE because the kubelet writes resources
// only through nodes/status after registration.
func (p *Policy) Hooks() []admission.Hook {
	fp := admissionregistrationv1.Ignore
	rule := func(resource string, ops ...admissionregistrationv1.OperationType) admissionregistrationv1.RuleWithOperations {
		return admissionregistrationv1.RuleWithOperations{
			Operations: ops,
			Rule: admissionregistrationv1.Rule{
				APIGroups:   []string{""},
				APIVersions: []string{"v1"},
				Resources:   []string{resource},
			},
		}
	}
	return []admission.Hook{
		{
			Policy: Name,
			Path:   MutatePath,
			Type:   admission.Mutating,
			Rules: []admissionregistrationv1.RuleWithOperations{
				rule("nodes", admissionregistrationv1.Create),
				rule("nodes/status", admissionregistrationv1.Update),
			},
			FailurePolicy: fp,
			Mutator:       p,
		},
		{
			Policy:        Name,
			Path:          ValidatePath,
			Type:          admission.Validating,
			Rules:         []admissionregistrationv1.RuleWithOperations{rule("nodes", admissionregistrationv1.Create, admissionregistrationv1.Update)},
			FailurePolicy: fp,
			Validator:     p,
		},
	}
}
