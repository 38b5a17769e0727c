package doctor

import (
	"context"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes"
)

// Snapshot is everything the checks look at: the webhooks, the namespaces,
// what stands behind each webhook Service, the in-cluster admission
// policies, and what doctor could not read (Gaps, plus each Backend's and
// the Policies' own). Checks are functions of a Snapshot (Diagnose); only
// handshakes and probes reach out. LoadSnapshot fills one with one pass of
// API reads; a long-running controller can keep one current from informers
// instead.
type Snapshot struct {
	// Webhooks of every MutatingWebhookConfiguration and
	// ValidatingWebhookConfiguration, in list order.
	Webhooks []*Webhook
	// Namespaces maps each namespace that is not Terminating to its labels.
	// NamespacesKnown is false when namespaces could not be listed (then it
	// holds the namespaces read one by one, if any).
	Namespaces      map[string]map[string]string
	NamespacesKnown bool
	// Backends maps "namespace/name" of every Service a webhook calls to
	// what stands behind it.
	Backends map[string]*Backend
	// Policies are the ValidatingAdmissionPolicies, MutatingAdmissionPolicies
	// and their bindings, with the CRDs their paramKinds name.
	Policies *PolicySet
	// Gaps are cluster-wide reads that were refused.
	Gaps []AccessGap
	// ServerVersion is the API server's /version (discovery), nil when it
	// could not be read: the version-aware rules (KD610, KD004, KD606's
	// text) depend on it and say so when it is nil.
	ServerVersion *version.Info
	// APIServerAddresses are the addresses of the default/kubernetes
	// Service's EndpointSlices: where the API server's calls to webhooks
	// come from, for NetworkPolicy peers (KD107), deduplicated and sorted.
	// APIServerAddressesKnown is false when they could not be read, or
	// name none or more than MaxAPIServerAddresses (loadAPIServerAddresses).
	APIServerAddresses      []string
	APIServerAddressesKnown bool
	// Dependencies are the workloads, cluster-wide, that webhook pods
	// need in order to start again (the CNI's DaemonSets, cluster DNS,
	// certificate issuers), for KD506, as DependenciesFrom finds them.
	// DependenciesKnown is false when DaemonSets or Deployments could not
	// be listed cluster-wide (then Dependencies hold what the other list
	// gave).
	Dependencies      []Dependency
	DependenciesKnown bool
}

// Dependency is a workload that other pods' recovery depends on: a Fail
// webhook intercepting the creation of its pods blocks that recovery
// while the webhook is down (KD506).
type Dependency struct {
	// Role is DependencyCNI, DependencyDNS or DependencyCertIssuer.
	Role      string
	Namespace string
	Workload  WorkloadRef
	// Labels are the labels of the workload's pod template: what a
	// re-created pod carries for objectSelectors.
	Labels map[string]string
}

// Dependency roles.
const (
	DependencyCNI        = "cni"
	DependencyDNS        = "dns"
	DependencyCertIssuer = "cert-issuer"
)

// AllGaps lists every gap of the snapshot, cluster-wide ones first.
func (s *Snapshot) AllGaps() []AccessGap {
	out := append([]AccessGap(nil), s.Gaps...)
	for _, k := range slices.Sorted(maps.Keys(s.Backends)) {
		out = append(out, s.Backends[k].Gaps...)
	}
	if s.Policies != nil {
		out = append(out, s.Policies.Gaps...)
	}
	return out
}

// LoadSnapshot reads the webhook configurations, namespaces, each webhook
// Service's backend and the admission policies, the API server's addresses
// (loadAPIServerAddresses) and the workloads pods depend on
// (loadDependencies: DaemonSets and Deployments in all namespaces). A read the API server
// refuses (403) or does not serve becomes an AccessGap; listing the webhook
// configurations themselves must succeed.
//
// Errors: listing MutatingWebhookConfigurations or
// ValidatingWebhookConfigurations failed, or another read failed with
// anything but Forbidden/not served (wrapped with what was being read).
func LoadSnapshot(ctx context.Context, cs kubernetes.Interface) (*Snapshot, error) {
	s := &Snapshot{Namespaces: map[string]map[string]string{}, Backends: map[string]*Backend{}}
	reg := cs.AdmissionregistrationV1()
	ml, err := reg.MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list MutatingWebhookConfigurations: %w", err)
	}
	vl, err := reg.ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ValidatingWebhookConfigurations: %w", err)
	}
	for i := range ml.Items {
		s.Webhooks = append(s.Webhooks, FromMutating(&ml.Items[i])...)
	}
	for i := range vl.Items {
		s.Webhooks = append(s.Webhooks, FromValidating(&vl.Items[i])...)
	}
	loader := &backendLoader{cs: cs}
	nl, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	switch {
	case isAccessGap(err):
		s.MarkNamespacesUnreadable(err)
	case err != nil:
		return nil, fmt.Errorf("list namespaces: %w", err)
	default:
		s.NamespacesKnown = true
		loader.namespaces = map[string]*corev1.Namespace{}
		for i, n := range nl.Items {
			loader.namespaces[n.Name] = &nl.Items[i]
			if n.Status.Phase != corev1.NamespaceTerminating {
				s.Namespaces[n.Name] = n.Labels
			}
		}
	}
	// Each namespace's Services, EndpointSlices, pods, workloads and
	// PodDisruptionBudgets are listed once and indexed: the reads grow
	// with the namespaces webhooks call into, not with the webhooks.
	for _, w := range s.Webhooks {
		if sv := w.ClientConfig.Service; sv != nil && s.Backends[w.ServiceKey()] == nil {
			b, err := loader.load(ctx, sv.Namespace, sv.Name)
			if err != nil {
				return nil, fmt.Errorf("webhook %s: %w", w.Name, err)
			}
			s.Backends[w.ServiceKey()] = b
			if !s.NamespacesKnown && b.NamespaceLabelsKnown {
				s.Namespaces[b.Namespace] = b.NamespaceLabels
			}
		}
	}
	if s.Policies, err = loadPolicies(ctx, cs); err != nil {
		return nil, err
	}
	s.ServerVersion = readServerVersion(ctx, cs)
	if err := s.loadAPIServerAddresses(ctx, cs); err != nil {
		return nil, err
	}
	if err := s.loadDependencies(ctx, cs); err != nil {
		return nil, err
	}
	return s, nil
}

// MarkNamespacesUnreadable records that namespaces could not be listed
// (err: the refusal; nil counts as forbidden): NamespacesKnown becomes
// false and a cluster-wide AccessGap says what the checks cannot tell.
func (s *Snapshot) MarkNamespacesUnreadable(err error) {
	s.NamespacesKnown = false
	s.Gaps = append(s.Gaps, newGap("list", "namespaces", "", "", err,
		"the labels of kube-system, kube-node-lease and the namespaces probes would use: namespaceSelectors were matched on kubernetes.io/metadata.name alone, which the API server always sets ("+IDInterceptsKubeSystem+", "+IDInterceptsNodeLeases+" and probes may be off)"))
}
