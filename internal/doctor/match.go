package doctor

import (
	"fmt"
	"maps"
	"sort"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	"github.com/kadmit/kadmit/internal/admission"
)

// Kinds of webhook configuration, as Webhook.Kind holds them.
const (
	KindMutating   = "MutatingWebhookConfiguration"
	KindValidating = "ValidatingWebhookConfiguration"
)

// Webhook is a mutating or validating webhook with the API server's defaults
// applied, so checks need not care which kind it came from.
type Webhook struct {
	Kind          string // KindMutating or KindValidating
	Configuration string
	Index         int // position in the configuration's webhooks list
	Name          string
	ClientConfig  admissionregistrationv1.WebhookClientConfig
	Rules         []admissionregistrationv1.RuleWithOperations
	FailurePolicy admissionregistrationv1.FailurePolicyType // defaulted to Fail
	SideEffects   admissionregistrationv1.SideEffectClass   // "" when unset
	// TimeoutSeconds defaulted to 10, as the API server does.
	TimeoutSeconds          int32
	AdmissionReviewVersions []string
	// NamespaceSelector and ObjectSelector are never nil: nil means "match
	// everything", as the API server defaults them.
	NamespaceSelector *metav1.LabelSelector
	ObjectSelector    *metav1.LabelSelector
	// MatchConditions are evaluated with the API server's CEL matcher
	// (EvalConditions); compiled once, on first use.
	MatchConditions []admissionregistrationv1.MatchCondition
	// ReinvocationPolicy of a mutating webhook, defaulted to Never as the
	// API server does; Never for validating webhooks, which are never
	// reinvoked (KD608).
	ReinvocationPolicy admissionregistrationv1.ReinvocationPolicyType
	// Annotations are a copy of the configuration's annotations (e.g.
	// cert-manager's cert-manager.io/inject-ca-from, naming the
	// certificate issuer and the injector that writes caBundle), shared by
	// the webhooks of one configuration: read only.
	Annotations map[string]string
	// Owners are the field managers (metadata.managedFields) owning this
	// webhook's caBundle and failurePolicy, from one read (KD609): one
	// entry per field and manager, newest first, at most MaxFieldOwners.
	// Several managers own a field together when they applied the same
	// value; none owns an empty caBundle.
	Owners []FieldOwner
	// Managers are the managedFields entries of the configuration that
	// own any field of this webhook (at least its list key, webhooks[name]),
	// with Field "": when each last changed the configuration, also after
	// another manager took caBundle or failurePolicy from it (KD609).
	// Newest first, at most MaxFieldOwners.
	Managers []FieldOwner
	// Writes are the changes of caBundle and failurePolicy a long-running
	// watcher saw, oldest first, with the manager that made each; nil for a
	// one-shot read (KD609).
	Writes []FieldWrite

	condOnce sync.Once
	cond     *compiledConditions
}

// FieldOwner is one managedFields entry owning a field of a webhook.
type FieldOwner struct {
	// Field is FieldCABundle or FieldFailurePolicy ("" in
	// Webhook.Managers: any field of the webhook).
	Field string
	// Manager is the entry's field manager, as the API server recorded it
	// (at most 128 bytes: FieldManagerMaxLength, k8s.io/apimachinery
	// v0.37.1 pkg/apis/meta/v1/validation); set by whoever writes the
	// configuration, so quote it when reporting.
	Manager   string
	Operation string // Apply or Update
	// Time is the entry's time (when that manager last changed the
	// configuration), zero when unset.
	Time time.Time
}

// The fields of a webhook whose owners and writes KD609 follows, as
// FieldOwner.Field and FieldWrite.Field name them.
const (
	FieldCABundle      = "caBundle"
	FieldFailurePolicy = "failurePolicy"
)

// MaxFieldOwners bounds Webhook.Owners and Webhook.Managers: the API
// server merges all but the newest ten Update managers into one entry
// (k8s.io/apiserver v0.37.1 pkg/endpoints/handlers/fieldmanager,
// DefaultMaxUpdateManagers), but Apply managers are not capped; a
// configuration with more owners than this is itself the anomaly and the
// newest ones are what a fight shows.
const MaxFieldOwners = 16

// FieldWrite is one observed change of a webhook's field.
type FieldWrite struct {
	// Field is "caBundle" or "failurePolicy".
	Field string
	// Manager is the field's owner after the change ("" when the field
	// was emptied and so has no owner).
	Manager string
	// Value is a short digest of the new value ("" when empty).
	Value string
	At    time.Time
}

// Fail reports whether a call error rejects the request.
func (w *Webhook) Fail() bool { return w.FailurePolicy != admissionregistrationv1.Ignore }

// resourceKind is the kubectl resource name of w's configuration kind.
func (w *Webhook) resourceKind() string {
	if w.Kind == KindMutating {
		return "mutatingwebhookconfiguration"
	}
	return "validatingwebhookconfiguration"
}

// ServiceKey is "namespace/name" of the clientConfig Service, or "".
func (w *Webhook) ServiceKey() string {
	if s := w.ClientConfig.Service; s != nil {
		return s.Namespace + "/" + s.Name
	}
	return ""
}

// ServicePort is clientConfig.service.port, defaulted to 443.
func (w *Webhook) ServicePort() int32 {
	if s := w.ClientConfig.Service; s != nil && s.Port != nil {
		return *s.Port
	}
	return 443
}

// ServerName is the name the API server verifies the certificate for:
// <svc>.<ns>.svc for a Service, the URL's host for a URL.
func (w *Webhook) ServerName() string {
	if s := w.ClientConfig.Service; s != nil {
		return s.Name + "." + s.Namespace + ".svc"
	}
	return ""
}

// Target renders where calls go, for reports.
func (w *Webhook) Target() string {
	if s := w.ClientConfig.Service; s != nil {
		p := ""
		if s.Path != nil {
			p = *s.Path
		}
		return fmt.Sprintf("service %s/%s:%d%s", s.Namespace, s.Name, w.ServicePort(), p)
	}
	if w.ClientConfig.URL != nil {
		return *w.ClientConfig.URL
	}
	return "<no service or url>"
}

// FromMutating converts every webhook of c, with the API server's
// defaults, its configuration's annotations and the owners of its caBundle
// and failurePolicy from c's managedFields.
func FromMutating(c *admissionregistrationv1.MutatingWebhookConfiguration) []*Webhook {
	out := make([]*Webhook, 0, len(c.Webhooks))
	mf := decodeManagedFields(c.ManagedFields)
	ann := maps.Clone(c.Annotations)
	for i, h := range c.Webhooks {
		w := normalize(&Webhook{
			Kind: KindMutating, Configuration: c.Name, Index: i, Name: h.Name,
			ClientConfig: h.ClientConfig, Rules: h.Rules, AdmissionReviewVersions: h.AdmissionReviewVersions,
			NamespaceSelector: h.NamespaceSelector, ObjectSelector: h.ObjectSelector, MatchConditions: h.MatchConditions,
			Annotations: ann,
		}, h.FailurePolicy, h.SideEffects, h.TimeoutSeconds)
		// Defaulted to Never (k8s.io/api v0.37.1 admissionregistration/v1
		// types.go, MutatingWebhook.ReinvocationPolicy).
		w.ReinvocationPolicy = admissionregistrationv1.NeverReinvocationPolicy
		if h.ReinvocationPolicy != nil {
			w.ReinvocationPolicy = *h.ReinvocationPolicy
		}
		w.Owners, w.Managers = mf.of(h.Name)
		out = append(out, w)
	}
	return out
}

// FromValidating converts every webhook of c, as FromMutating does.
func FromValidating(c *admissionregistrationv1.ValidatingWebhookConfiguration) []*Webhook {
	out := make([]*Webhook, 0, len(c.Webhooks))
	mf := decodeManagedFields(c.ManagedFields)
	ann := maps.Clone(c.Annotations)
	for i, h := range c.Webhooks {
		w := normalize(&Webhook{
			Kind: KindValidating, Configuration: c.Name, Index: i, Name: h.Name,
			ClientConfig: h.ClientConfig, Rules: h.Rules, AdmissionReviewVersions: h.AdmissionReviewVersions,
			NamespaceSelector: h.NamespaceSelector, ObjectSelector: h.ObjectSelector, MatchConditions: h.MatchConditions,
			Annotations: ann,
		}, h.FailurePolicy, h.SideEffects, h.TimeoutSeconds)
		w.ReinvocationPolicy = admissionregistrationv1.NeverReinvocationPolicy
		w.Owners, w.Managers = mf.of(h.Name)
		out = append(out, w)
	}
	return out
}

// managedEntry is one decoded managedFields entry.
type managedEntry struct {
	owner FieldOwner // Field unset
	set   *fieldpath.Set
}

// managedSets are a configuration's managedFields entries, decoded once
// for all its webhooks, newest first.
type managedSets []managedEntry

// decodeManagedFields decodes the FieldsV1 sets of entries with
// structured-merge-diff's fieldpath (the encoding the API server's field
// manager writes). Entries of a subresource, or whose set does not
// decode, own nothing here (the API server wrote them, so this does not
// happen short of a corrupted object).
func decodeManagedFields(entries []metav1.ManagedFieldsEntry) managedSets {
	out := make(managedSets, 0, len(entries))
	for _, e := range entries {
		if e.FieldsV1 == nil || e.Subresource != "" {
			continue
		}
		s := &fieldpath.Set{}
		if err := s.FromJSON(e.FieldsV1.GetRawReader()); err != nil {
			continue
		}
		o := FieldOwner{Manager: e.Manager, Operation: string(e.Operation)}
		if e.Time != nil {
			o.Time = e.Time.Time
		}
		out = append(out, managedEntry{owner: o, set: s})
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].owner.Time.After(out[b].owner.Time) })
	return out
}

// of returns the owners of webhook hook's caBundle and failurePolicy and
// the managers owning any of its fields. The webhooks list is a map keyed
// by name (+listType=map +listMapKey=name, k8s.io/api v0.37.1
// admissionregistration/v1 types.go), so its items are
// webhooks[k:{"name":"<hook>"}] in managedFields.
func (m managedSets) of(hook string) (owners, managers []FieldOwner) {
	if len(m) == 0 {
		return nil, nil
	}
	item := fieldpath.KeyElementByFields("name", hook)
	webhooks := fieldpath.FieldNameElement("webhooks")
	caBundle := fieldpath.Path{webhooks, item, fieldpath.FieldNameElement("clientConfig"), fieldpath.FieldNameElement("caBundle")}
	failurePolicy := fieldpath.Path{webhooks, item, fieldpath.FieldNameElement("failurePolicy")}
	for _, e := range m {
		if e.set.Has(caBundle) && len(owners) < MaxFieldOwners {
			o := e.owner
			o.Field = FieldCABundle
			owners = append(owners, o)
		}
		if e.set.Has(failurePolicy) && len(owners) < MaxFieldOwners {
			o := e.owner
			o.Field = FieldFailurePolicy
			owners = append(owners, o)
		}
		// The item itself (".") or any field below it.
		if (e.set.Has(fieldpath.Path{webhooks, item}) || !e.set.WithPrefix(webhooks).WithPrefix(item).Empty()) && len(managers) < MaxFieldOwners {
			managers = append(managers, e.owner)
		}
	}
	return owners, managers
}

func normalize(w *Webhook, fp *admissionregistrationv1.FailurePolicyType, se *admissionregistrationv1.SideEffectClass, timeout *int32) *Webhook {
	w.FailurePolicy = admissionregistrationv1.Fail
	if fp != nil {
		w.FailurePolicy = *fp
	}
	if se != nil {
		w.SideEffects = *se
	}
	w.TimeoutSeconds = 10
	if timeout != nil {
		w.TimeoutSeconds = *timeout
	}
	if w.NamespaceSelector == nil {
		w.NamespaceSelector = &metav1.LabelSelector{}
	}
	if w.ObjectSelector == nil {
		w.ObjectSelector = &metav1.LabelSelector{}
	}
	return w
}

// Request describes an admission request for rule matching: the resource in
// lower-case plural ("pods"), the subresource ("" or e.g. "status").
type Request struct {
	Group, Version, Resource, Subresource string
	Operation                             admissionregistrationv1.OperationType
	// Namespaced is the resource's scope.
	Namespaced bool
}

func (r Request) String() string {
	gv := r.Version
	if r.Group != "" {
		gv = r.Group + "/" + r.Version
	}
	res := r.Resource
	if r.Subresource != "" {
		res += "/" + r.Subresource
	}
	return fmt.Sprintf("%s %s (%s)", r.Operation, res, gv)
}

// RuleMatches reports whether any rule selects req, with the API server's
// own matcher, the one kadmit serves with (admission.MatchRules): "*" in
// groups, versions and operations; resources "*" (main resources only),
// "*/*" (everything), "pods", "pods/*" (pods and its subresources),
// "*/status"; scope "*" (default), "Cluster" or "Namespaced". matchPolicy
// Equivalent (other versions or groups of the same resource) is not
// modelled: rules are taken literally.
func RuleMatches(rules []admissionregistrationv1.RuleWithOperations, req Request) bool {
	// Scope is decided by whether the request has a namespace; any name
	// stands for the namespace of a namespaced resource.
	ns := ""
	if req.Namespaced {
		ns = "namespaced"
	}
	gvr := schema.GroupVersionResource{Group: req.Group, Version: req.Version, Resource: req.Resource}
	return admission.MatchRules(rules, admission.NewRuleAttributes(gvr, req.Subresource, admissionv1.Operation(req.Operation), ns))
}

// SelectorMatches evaluates a label selector against a label set with
// metav1.LabelSelectorAsSelector; a nil or empty selector matches
// everything. It fails when the selector is invalid (the API server would
// have refused it, so this means a bug or an old object).
func SelectorMatches(sel *metav1.LabelSelector, set map[string]string) (bool, error) {
	if sel == nil {
		return true, nil
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false, fmt.Errorf("invalid label selector %s: %w", metav1.FormatLabelSelector(sel), err)
	}
	return s.Matches(labels.Set(set)), nil
}

// Object is what a webhook is matched against: the request, the labels of
// the object and (for namespaced resources) of its namespace.
type Object struct {
	Request
	// Kind is the object's kind ("Pod"), for the request matchConditions see.
	Kind            string
	Namespace       string
	NamespaceLabels map[string]string
	// NamespaceLabelsUnknown: the namespace could not be read, so
	// NamespaceLabels hold only kubernetes.io/metadata.name.
	NamespaceLabelsUnknown bool
	Labels                 map[string]string
	// Name of the object ("" for a CREATE with generateName).
	Name string
	// Body holds further top-level fields of the object (e.g. "spec").
	Body map[string]any
	// User makes the request (request.userInfo for matchConditions).
	User Requester
	// Describe names the object for messages, e.g. "pod kruise-system/x".
	Describe string
}

// Intercepts reports whether w's rules, namespaceSelector (namespaced
// resources and Namespace objects) and objectSelector select obj.
// matchConditions are evaluated separately (EvalConditions), since they
// need a context and may not be exact.
func (w *Webhook) Intercepts(obj Object) (bool, error) {
	if !RuleMatches(w.Rules, obj.Request) {
		return false, nil
	}
	if obj.Namespaced || (obj.Group == "" && obj.Resource == "namespaces") {
		ok, err := SelectorMatches(w.NamespaceSelector, obj.NamespaceLabels)
		if err != nil || !ok {
			return false, err
		}
	}
	return SelectorMatches(w.ObjectSelector, obj.Labels)
}

// namespaceLabels returns the labels the API server matches a namespace
// with: its own, plus kubernetes.io/metadata.name, which the API server
// always sets (so a namespace that does not exist yet is modelled too).
func namespaceLabels(name string, own map[string]string) map[string]string {
	out := make(map[string]string, len(own)+1)
	for k, v := range own {
		out[k] = v
	}
	out[metadataNameLabel] = name
	return out
}

const metadataNameLabel = "kubernetes.io/metadata.name"
