package celpolicy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/policy/generic"
	"k8s.io/apiserver/pkg/admission/plugin/policy/matching"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	auditinternal "k8s.io/apiserver/pkg/apis/audit"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/warning"
	"k8s.io/client-go/applyconfigurations"
	"k8s.io/client-go/informers"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// Engine evaluates a compiled Set. It is safe for concurrent use and never
// changes after New: a new policy set is a new Engine.
type Engine struct {
	validating []validating.PolicyHook
	mutating   []mutating.PolicyHook
	// validatingByName finds a policy's hook for ValidatePolicy (the
	// served validating hooks); a mutating hook holds its index (mapHook).
	validatingByName map[string]int

	set        *Set
	namespaces corelisters.NamespaceLister
	authz      authorizer.UnconditionalAuthorizer
	objects    admission.ObjectInterfaces
	types      *typeConverters

	// fields holds, by validating policy name, the top-level members its
	// expressions read (nil: the whole object); validatingUnion is their
	// union, what a request shared between hooks decodes.
	fields          map[string]fieldSet
	validatingUnion fieldSet
	// decoded shares the served requests' decoded objects between hooks.
	decoded requestCache
	// budget and maxObject bound what the served hooks decode (Options);
	// mutators holds the meter the mutating hooks of a request share.
	budget    *Budget
	mutators  requestMeters
	maxObject int
}

// Options configure New.
type Options struct {
	// Namespaces, when set, answers namespace lookups (namespaceSelector,
	// the namespaceObject variable) for requests that carry no namespace
	// object, as the API server's namespace informer does. A namespace it
	// does not know, or every namespace when it is nil, is taken to have
	// only the label kubernetes.io/metadata.name, which the API server sets
	// on every namespace.
	Namespaces corelisters.NamespaceLister
	// Authorizer answers the CEL authorizer variable. Nil: every check is
	// "no opinion" (not allowed), with reason "kadmit has no authorizer
	// offline".
	Authorizer authorizer.UnconditionalAuthorizer
	// Budget, shared by every Engine of a process, bounds the memory of
	// the objects the served hooks (Hooks) hold decoded at once; a request
	// it cannot serve gets HTTP 503 (ErrDecodeBudget). Nil: unbounded, for
	// offline use (`kadmit review`, `kadmit test`).
	Budget *Budget
	// MaxObjectBytes is the largest object or oldObject (JSON bytes) the
	// served hooks evaluate policies on; a larger one gets HTTP 413
	// (ErrObjectTooLarge), so the policy's failurePolicy decides. 0:
	// DefaultMaxObjectBytes; negative: no bound.
	MaxObjectBytes int
	// Defaulter, when set, defaults the object each mutation produced, as
	// the API server defaults a MutatingAdmissionPolicy's result
	// (mutating/dispatcher.go:274, v0.37.1) with the scheme of its
	// built-in kinds; the objects it gets are unstructured. Nil: no
	// defaulting (kadmit has no scheme of its own).
	Defaulter runtime.ObjectDefaulter
}

// New compiles every policy of set once (mirroring generic/policy_source.go
// calculatePolicyData, v0.37.1: one hook per policy with its bindings; a
// binding's param store is the set's objects of the policy's paramKind).
// Expressions that do not compile were already refused by Load; any other
// compile problem is kept in the evaluator and reported on the requests
// the policy matches, under its failurePolicy, as the API server does.
func New(set *Set, opts Options) (*Engine, error) {
	e := &Engine{
		set:              set,
		namespaces:       opts.Namespaces,
		authz:            opts.Authorizer,
		validatingByName: map[string]int{},
		objects:          admission.NewObjectInterfacesFromScheme(runtime.NewScheme()),
		types:            sharedTypeConverters(),
		fields:           map[string]fieldSet{},
		budget:           opts.Budget,
		maxObject:        opts.MaxObjectBytes,
	}
	if opts.Defaulter != nil {
		e.objects = defaultingObjects{e.objects, opts.Defaulter}
	}
	e.decoded.budget = opts.Budget
	if e.maxObject == 0 {
		e.maxObject = DefaultMaxObjectBytes
	}
	if e.authz == nil {
		e.authz = offlineAuthorizer{}
	}
	params := newParamStores(set.Params)

	for _, p := range set.Validating {
		h := validating.PolicyHook{Policy: p, Evaluator: compileValidating(p)}
		e.fields[p.Name] = validatingFields(p)
		for _, b := range set.ValidatingBinding {
			if b.Spec.PolicyName == p.Name {
				h.Bindings = append(h.Bindings, b)
			}
		}
		h.ParamInformer, h.ParamScope, h.ConfigurationError = params.forKind(p.Spec.ParamKind)
		e.validatingByName[p.Name] = len(e.validating)
		e.validating = append(e.validating, h)
	}
	for _, p := range set.Mutating {
		h := mutating.PolicyHook{Policy: p, Evaluator: compileMutating(p)}
		for _, b := range set.MutatingBinding {
			if b.Spec.PolicyName == p.Name {
				h.Bindings = append(h.Bindings, b)
			}
		}
		h.ParamInformer, h.ParamScope, h.ConfigurationError = params.forKind(p.Spec.ParamKind)
		e.mutating = append(e.mutating, h)
	}
	e.validatingUnion = fieldSet{}
	for _, fs := range e.fields {
		if e.validatingUnion = union(e.validatingUnion, fs); e.validatingUnion == nil {
			break
		}
	}
	return e, nil
}

// Set returns the policy set the engine was built from.
func (e *Engine) Set() *Set { return e.set }

// Request is one admission request as the API server's admission chain sees
// it. Object and OldObject are JSON in the version of Kind (nil when absent:
// no object on DELETE, no old object on CREATE).
type Request struct {
	Kind        schema.GroupVersionKind
	Resource    schema.GroupVersionResource
	SubResource string
	Name        string
	Namespace   string
	// Operation is CREATE, UPDATE, DELETE or CONNECT.
	Operation admission.Operation
	Object    []byte
	OldObject []byte
	// Options is the operation's options object as JSON (CreateOptions,
	// UpdateOptions, DeleteOptions), or nil.
	Options  []byte
	DryRun   bool
	UserInfo authenticationv1.UserInfo
	// NamespaceObject is the request namespace's object; nil to look it up
	// (see Options.Namespaces).
	NamespaceObject *corev1.Namespace

	// shared, when set, holds the decoded objects every hook of one served
	// admission request uses (see requestCache).
	shared *decoded
	// meter, when set, is charged with what this evaluation decodes (see
	// Budget); the served hook gives it back when it returns.
	meter *meter
}

// Decision is what the API server decides about a request with the
// engine's policies in tree.
type Decision struct {
	// Allowed is false when a policy denied (or failed under failurePolicy
	// Fail).
	Allowed bool
	// Status is the error the API server returns when denied, exactly:
	// code (403 Forbidden, 422 Invalid, ... from the validation's reason),
	// reason, message ("pods \"x\" is forbidden: ValidatingAdmissionPolicy
	// 'p' with binding 'b' denied request: ...") and details.causes.
	Status *metav1.Status
	// Warnings in the order the policies added them (duplicates dropped, as
	// the API server's warning recorder does).
	Warnings []string
	// AuditAnnotations the policies published (keys "<policy>/<key>" and
	// "validation.policy.admission.k8s.io/validation_failure").
	AuditAnnotations map[string]string
	// Object is the object after the mutating policies (Mutate only; the
	// request's object when nothing changed). The API server then runs its
	// defaulting on the result, which kadmit cannot do offline for built-in
	// kinds: a field a mutation adds without its defaults stays so here.
	Object []byte
	// Changed reports whether a mutation changed the object.
	Changed bool
}

// Message is the denial as a webhook states it: Status's cause, without
// the "<resource> \"<name>\" is forbidden: " prefix the API server adds
// to in-tree denials.
func (d *Decision) Message() string {
	if d.Status == nil {
		return ""
	}
	if c := d.Status.Details; c != nil && len(c.Causes) > 0 {
		return c.Causes[len(c.Causes)-1].Message
	}
	return d.Status.Message
}

// admissionConfigResources are never evaluated by API-defined policies
// (generic/plugin.go admissionResources, v0.37.1); excludedResources are
// the non-persisted review resources the API server excludes from every
// admission plugin (k8s.io/kubernetes pkg/kubeapiserver/admission/exclusion/
// resources.go excluded, v1.37.1).
var (
	admissionConfigResources = map[schema.GroupResource]bool{
		{Group: admissionregistrationv1.GroupName, Resource: "validatingadmissionpolicies"}:       true,
		{Group: admissionregistrationv1.GroupName, Resource: "validatingadmissionpolicybindings"}: true,
		{Group: admissionregistrationv1.GroupName, Resource: "mutatingadmissionpolicies"}:         true,
		{Group: admissionregistrationv1.GroupName, Resource: "mutatingadmissionpolicybindings"}:   true,
	}
	excludedResources = map[schema.GroupResource]bool{
		{Group: "authentication.k8s.io", Resource: "tokenreviews"}:             true,
		{Group: "authentication.k8s.io", Resource: "selfsubjectreviews"}:       true,
		{Group: "authorization.k8s.io", Resource: "subjectaccessreviews"}:      true,
		{Group: "authorization.k8s.io", Resource: "localsubjectaccessreviews"}: true,
		{Group: "authorization.k8s.io", Resource: "selfsubjectaccessreviews"}:  true,
		{Group: "authorization.k8s.io", Resource: "selfsubjectrulesreviews"}:   true,
	}
)

func skipped(req *Request) bool {
	gr := req.Resource.GroupResource()
	return admissionConfigResources[gr] || excludedResources[gr]
}

// Validate runs every ValidatingAdmissionPolicy on req, as the API
// server's ValidatingAdmissionPolicy plugin does (validating/plugin.go
// Validate → generic/plugin.go Dispatch → validating/dispatcher.go
// Dispatch, v0.37.1). It fails only when req cannot be turned into
// admission attributes (invalid object JSON).
func (e *Engine) Validate(ctx context.Context, req *Request) (*Decision, error) {
	return e.validate(ctx, req, e.validating)
}

// ValidatePolicy is Validate with only the named policy.
func (e *Engine) ValidatePolicy(ctx context.Context, policy string, req *Request) (*Decision, error) {
	i, ok := e.validatingByName[policy]
	if !ok {
		return nil, fmt.Errorf("no ValidatingAdmissionPolicy %q", policy)
	}
	return e.validate(ctx, req, e.validating[i:i+1])
}

func (e *Engine) validate(ctx context.Context, req *Request, hooks []validating.PolicyHook) (*Decision, error) {
	// validating/plugin.go NewPlugin: the handler handles CONNECT, CREATE,
	// DELETE and UPDATE, i.e. every operation.
	if skipped(req) || len(hooks) == 0 {
		return &Decision{Allowed: true, Object: req.Object}, nil
	}
	obj, old, err := e.validatingObjects(req, hooks)
	if err != nil {
		return nil, err
	}
	a, err := e.attributes(req, obj, old)
	if err != nil {
		return nil, err
	}
	rec := &warnings{}
	ctx = warning.WithWarningRecorder(ctx, rec)
	d := validating.NewDispatcher(e.authz, generic.NewPolicyMatcher(e.matcher(req)))
	err = d.Dispatch(ctx, a, e.objects, hooks)
	return decide(err, a, rec, req.Object), nil
}

// validatingObjects returns req's object and oldObject decoded for hooks:
// only the top-level members their expressions read (see fieldSet), or,
// for a request the served webhook shares between hooks, the members any
// validating policy of the engine reads, decoded once for all of them.
func (e *Engine) validatingObjects(req *Request, hooks []validating.PolicyHook) (runtime.Object, runtime.Object, error) {
	if req.shared != nil {
		return req.shared.objects(req, e.validatingUnion)
	}
	fs := fieldSet{}
	for i := range hooks {
		if fs = union(fs, e.fields[hooks[i].Policy.Name]); fs == nil {
			break
		}
	}
	obj, err := decodeFields(req.Object, req.Kind, "object", fs, req.meter)
	if err != nil {
		return nil, nil, err
	}
	old, err := decodeFields(req.OldObject, req.Kind, "oldObject", fs, req.meter)
	if err != nil {
		return nil, nil, err
	}
	return obj, old, nil
}

// Mutate runs every MutatingAdmissionPolicy on req, as the API server's
// MutatingAdmissionPolicy plugin does, with its reinvocation: when a
// mutation changed the object, policies with reinvocationPolicy IfNeeded
// run once more (admission/reinvocation.go reinvoker.Admit and
// mutating/dispatcher.go dispatchInvocations, v0.37.1). DELETE is not
// handled (mutating/plugin.go NewPlugin).
func (e *Engine) Mutate(ctx context.Context, req *Request) (*Decision, error) {
	return e.mutate(ctx, req, e.mutating)
}

func (e *Engine) mutate(ctx context.Context, req *Request, hooks []mutating.PolicyHook) (*Decision, error) {
	if skipped(req) || len(hooks) == 0 || req.Operation == admission.Delete || req.Object == nil {
		return &Decision{Allowed: true, Object: req.Object}, nil
	}
	// The mutating dispatcher writes the patched object back into the
	// attributes' object: each evaluation decodes its own. Its patchers
	// build the patched object beside it (through structured-merge-diff's
	// typed values for an ApplyConfiguration), and the diff below decodes
	// the request's and the patched JSON again: mutateFactor estimates of
	// the object, charged before the first decode.
	a, err := e.mutatingAttributes(req)
	if err != nil {
		return nil, err
	}
	rec := &warnings{}
	ctx = warning.WithWarningRecorder(ctx, rec)
	d := mutating.NewDispatcher(e.authz, e.matcher(req), e.types)
	err = d.Dispatch(ctx, a, e.objects, hooks)
	if err == nil {
		if rc := a.GetReinvocationContext(); rc.ShouldReinvoke() {
			rc.SetIsReinvoke()
			err = d.Dispatch(ctx, a, e.objects, hooks)
		}
	}
	dec := decide(err, a, rec, req.Object)
	if !dec.Allowed {
		return dec, nil
	}
	out, err := json.Marshal(a.GetObject())
	if err != nil {
		return nil, fmt.Errorf("encode the mutated object: %w", err)
	}
	changed, err := jsonChanged(req.Object, out)
	if err != nil {
		return nil, err
	}
	if changed {
		dec.Object, dec.Changed = out, true
	}
	return dec, nil
}

// errRunStopped is mutateRun's error when its caller stopped it (a
// denial ended the chain).
var errRunStopped = errors.New("the run was stopped")

// mutateRun runs hooks, in order, on one decoded copy of req's object,
// as the API server's MutatingAdmissionPolicy plugin runs the policies
// of a request in one dispatcher (mutating/dispatcher.go
// dispatchInvocations, v0.37.1): each policy sees the object as the ones
// before it left it, and, when the run changed it, the policies with
// reinvocationPolicy IfNeeded run once more, in order (admission/
// reinvocation.go reinvoker.Admit). Each policy is dispatched on its own
// over the one attributes record, whose reinvocation context carries the
// dispatcher's bookkeeping from one to the next: a policy that runs
// dirties the object, so after the first pass every IfNeeded policy that
// ran is due again, the set one dispatch over all of them reaches. So
// each policy gets its own decision: its error, the warnings it added
// (one recorder for the run drops duplicates, as the API server's
// does) and its audit annotations, handed to each with its index (d.Object
// unset) right after it ran; enter(i) is called before. When each returns
// false, mutateRun returns errRunStopped. It returns the mutated object,
// encoded once, or nil when it is unchanged; any other error is the
// request's (decode, budget, abandoned) at hook at, before it ran.
func (e *Engine) mutateRun(ctx context.Context, req *Request, hooks []mutating.PolicyHook, enter func(int), each func(int, *Decision) bool) (out []byte, at int, err error) {
	if skipped(req) || len(hooks) == 0 || req.Operation == admission.Delete || req.Object == nil {
		return nil, 0, nil
	}
	// One decoded object for the run; patching builds the patched object
	// beside it (through structured-merge-diff's typed values for an
	// ApplyConfiguration), the dispatcher keeps a deep copy of its last
	// output, and the diff decodes the request's and the patched JSON
	// again: mutateFactor estimates of the object, charged once, before
	// the decode.
	a, err := e.mutatingAttributes(req)
	if err != nil {
		return nil, 0, err
	}
	rec := &warnings{}
	ctx = warning.WithWarningRecorder(ctx, rec)
	d := mutating.NewDispatcher(e.authz, e.matcher(req), e.types)
	annotations := make([]map[string]string, len(hooks))
	pass := func() (int, error) {
		for i := range hooks {
			if err := ctx.Err(); err != nil {
				return i, err
			}
			enter(i)
			seen := len(rec.list)
			a.annotations = annotations[i]
			err := d.Dispatch(ctx, a, e.objects, hooks[i:i+1])
			annotations[i] = a.annotations
			dec := decide(err, a, rec, nil)
			dec.Warnings = append([]string(nil), rec.list[seen:]...)
			if !each(i, dec) || !dec.Allowed {
				return i, errRunStopped
			}
		}
		return 0, nil
	}
	if at, err := pass(); err != nil {
		return nil, at, err
	}
	if rc := a.GetReinvocationContext(); rc.ShouldReinvoke() {
		rc.SetIsReinvoke()
		if at, err := pass(); err != nil {
			return nil, at, err
		}
	}
	out, err = json.Marshal(a.GetObject())
	if err != nil {
		return nil, len(hooks) - 1, fmt.Errorf("encode the mutated object: %w", err)
	}
	changed, err := jsonChanged(req.Object, out)
	if err != nil || !changed {
		return nil, len(hooks) - 1, err
	}
	return out, 0, nil
}

// decide turns the dispatcher's error into the API server's answer: a
// StatusError is returned to the client as it is; any other error becomes
// an internal error (500), as the API server's handlers do
// (endpoints/handlers/responsewriters: ErrorToAPIStatus).
func decide(err error, a *attributes, rec *warnings, obj []byte) *Decision {
	d := &Decision{Allowed: err == nil, Warnings: rec.list, AuditAnnotations: a.annotations, Object: obj}
	if err != nil {
		var se apierrors.APIStatus
		if errors.As(err, &se) {
			st := se.Status()
			d.Status = &st
		} else {
			st := apierrors.NewInternalError(err).Status()
			d.Status = &st
		}
	}
	return d
}

// attributes is the admission.Attributes the dispatchers see; it keeps
// the audit annotations they add (the API server's attributesRecord keeps
// them unexported).
type attributes struct {
	admission.Attributes
	annotations map[string]string
}

func (a *attributes) AddAnnotation(key, value string) error {
	return a.AddAnnotationWithLevel(key, value, "")
}

func (a *attributes) AddAnnotationWithLevel(key, value string, _ auditinternal.Level) error {
	if a.annotations == nil {
		a.annotations = map[string]string{}
	}
	// attributesRecord.AddAnnotationWithLevel refuses to overwrite a key
	// with a different value (admission/attributes.go, v0.37.1).
	if v, ok := a.annotations[key]; ok && v != value {
		return fmt.Errorf("admission annotations are not allowed to be overwritten, key:%q, old value: %q, new value:%q", key, v, value)
	}
	a.annotations[key] = value
	return nil
}

// mutatingAttributes charges req's meter for a mutating run (mutateFactor
// estimates of the object, plus the old object's unless a shared decode
// holds it), decodes the object and the old object once and builds the
// attributes record mutate and mutateRun dispatch over. Its errors are the
// request's (budget, decode).
func (e *Engine) mutatingAttributes(req *Request) (*attributes, error) {
	if req.meter != nil {
		need := mutateFactor * estimate(req.Object)
		if req.shared == nil && req.OldObject != nil {
			need += estimate(req.OldObject)
		}
		if err := req.meter.ensure(need); err != nil {
			return nil, fmt.Errorf("object: %w", err)
		}
	}
	obj, err := decodeObject(req.Object, req.Kind, "object", nil)
	if err != nil {
		return nil, err
	}
	var old runtime.Object
	if req.shared != nil {
		old, err = req.shared.oldObject(req)
	} else {
		old, err = decodeObject(req.OldObject, req.Kind, "oldObject", nil)
	}
	if err != nil {
		return nil, err
	}
	return e.attributes(req, obj, old)
}

// attributes builds the dispatchers' admission attributes of req with its
// object and oldObject decoded (nil when absent).
func (e *Engine) attributes(req *Request, obj, old runtime.Object) (*attributes, error) {
	var options runtime.Object
	if len(req.Options) > 0 {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(req.Options); err != nil {
			return nil, fmt.Errorf("options: %w", err)
		}
		options = u
	}
	extra := map[string][]string{}
	for k, v := range req.UserInfo.Extra {
		extra[k] = v
	}
	ui := &user.DefaultInfo{Name: req.UserInfo.Username, UID: req.UserInfo.UID, Groups: req.UserInfo.Groups, Extra: extra}
	rec := admission.NewAttributesRecord(obj, old, req.Kind, req.Namespace, req.Name, req.Resource, req.SubResource, req.Operation, options, req.DryRun, ui)
	return &attributes{Attributes: rec}, nil
}

// matcher is the API server's policy matcher (policy/matching, v0.37.1)
// over this request's namespace lookup. Its client is never used: every
// namespace resolves (see namespaceLister).
func (e *Engine) matcher(req *Request) *matching.Matcher {
	return matching.NewMatcher(namespaceLister{given: req.NamespaceObject, fallback: e.namespaces}, nil)
}

// namespaceLister answers the matcher's namespace lookups: the request's
// namespace object when given, else the engine's lister, else a namespace
// with only the kubernetes.io/metadata.name label every namespace carries
// (the API server sets it: k8s.io/kubernetes pkg/registry/core/namespace/
// strategy.go PrepareForCreate, v1.37.1).
type namespaceLister struct {
	given    *corev1.Namespace
	fallback corelisters.NamespaceLister
}

func (l namespaceLister) List(selector labels.Selector) ([]*corev1.Namespace, error) {
	if l.fallback != nil {
		return l.fallback.List(selector)
	}
	if l.given != nil && selector.Matches(labels.Set(l.given.Labels)) {
		return []*corev1.Namespace{l.given}, nil
	}
	return nil, nil
}

func (l namespaceLister) Get(name string) (*corev1.Namespace, error) {
	if l.given != nil && l.given.Name == name {
		return l.given, nil
	}
	if l.fallback != nil {
		if ns, err := l.fallback.Get(name); err == nil {
			return ns, nil
		}
	}
	return &corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelMetadataName: name}},
	}, nil
}

// warnings is the warning.Recorder of one request; like the API server's
// (endpoints/filters/warning.go recorder, v0.37.1) it drops duplicates.
type warnings struct {
	mu   sync.Mutex
	list []string
}

// maxWarnings bounds the warnings kept per request.
const maxWarnings = 100

func (w *warnings) AddWarning(_, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, t := range w.list {
		if t == text {
			return
		}
	}
	if len(w.list) < maxWarnings {
		w.list = append(w.list, text)
	}
}

type offlineAuthorizer struct{}

func (offlineAuthorizer) Authorize(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
	return authorizer.DecisionNoOpinion, "kadmit has no authorizer offline", nil
}

// typeConverters is the mutating dispatcher's patch.TypeConverterManager:
// built-in kinds use the schemas client-go's apply configurations are
// generated from (the API server's own OpenAPI, same version), so
// ApplyConfiguration merges lists and maps by the same keys; other kinds
// (custom resources, whose schema kadmit does not have) use the deduced
// converter, which merges every list atomically.
type typeConverters struct {
	builtin managedfields.TypeConverter
	deduced managedfields.TypeConverter
}

var (
	typeConvertersOnce sync.Once
	typeConvertersVal  *typeConverters
)

func sharedTypeConverters() *typeConverters {
	typeConvertersOnce.Do(func() {
		typeConvertersVal = &typeConverters{
			builtin: applyconfigurations.NewTypeConverter(clientgoscheme.Scheme),
			deduced: managedfields.NewDeducedTypeConverter(),
		}
	})
	return typeConvertersVal
}

func (t *typeConverters) GetTypeConverter(gvk schema.GroupVersionKind) managedfields.TypeConverter {
	if clientgoscheme.Scheme.Recognizes(gvk) {
		return t.builtin
	}
	return t.deduced
}

func (t *typeConverters) Run(context.Context) {}

// paramStores holds the set's params by kind: the informers the API server
// starts per paramKind (generic/policy_source.go ensureParamsForPolicyLocked,
// v0.37.1), here over a fixed list.
type paramStores map[schema.GroupVersionKind]*paramStore

type paramStore struct {
	indexer cache.Indexer
	scope   meta.RESTScope
}

func newParamStores(params []*unstructured.Unstructured) paramStores {
	s := paramStores{}
	for _, p := range params {
		gvk := p.GroupVersionKind()
		ps := s[gvk]
		if ps == nil {
			ps = &paramStore{indexer: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}), scope: meta.RESTScopeRoot}
			s[gvk] = ps
		}
		if p.GetNamespace() != "" {
			ps.scope = meta.RESTScopeNamespace
		}
		_ = ps.indexer.Add(p)
	}
	return s
}

// clusterScopedKinds are the built-in kinds a paramKind may name that are
// cluster-scoped: the scope of a paramKind with no loaded objects (the API
// server reads it from its REST mapping). Any other kind without objects
// is taken as namespaced.
var clusterScopedKinds = map[schema.GroupKind]bool{
	{Kind: "Namespace"}: true, {Kind: "Node"}: true, {Kind: "PersistentVolume"}: true,
	{Group: "rbac.authorization.k8s.io", Kind: "ClusterRole"}:                  true,
	{Group: "rbac.authorization.k8s.io", Kind: "ClusterRoleBinding"}:           true,
	{Group: "storage.k8s.io", Kind: "StorageClass"}:                            true,
	{Group: "scheduling.k8s.io", Kind: "PriorityClass"}:                        true,
	{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}:          true,
	{Group: "admissionregistration.k8s.io", Kind: "ValidatingAdmissionPolicy"}: true,
}

func (s paramStores) forKind(pk *admissionregistrationv1.ParamKind) (informers.GenericInformer, meta.RESTScope, error) {
	if pk == nil {
		return nil, nil, nil
	}
	gv, err := schema.ParseGroupVersion(pk.APIVersion)
	if err != nil {
		// generic/policy_source.go calculatePolicyData skips such a policy;
		// its validation refuses it on create.
		return nil, nil, fmt.Errorf("failed to parse paramKind APIVersion: %w", err)
	}
	gvk := gv.WithKind(pk.Kind)
	ps := s[gvk]
	if ps == nil {
		ps = &paramStore{indexer: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}), scope: meta.RESTScopeNamespace}
		if clusterScopedKinds[gvk.GroupKind()] {
			ps.scope = meta.RESTScopeRoot
		}
		s[gvk] = ps
	}
	gr := schema.GroupResource{Group: gvk.Group, Resource: gvk.Kind}
	return staticInformer{indexer: ps.indexer, gr: gr}, ps.scope, nil
}

// staticInformer is an informers.GenericInformer over a fixed list. Of the
// informer, generic.CollectParams (v0.37.1) calls only HasSynced.
type staticInformer struct {
	indexer cache.Indexer
	gr      schema.GroupResource
}

func (s staticInformer) Informer() cache.SharedIndexInformer { return syncedInformer{} }
func (s staticInformer) Lister() cache.GenericLister         { return cache.NewGenericLister(s.indexer, s.gr) }

type syncedInformer struct{ cache.SharedIndexInformer }

func (syncedInformer) HasSynced() bool { return true }

// defaultingObjects are the engine's ObjectInterfaces with Options.Defaulter
// as the object defaulter.
type defaultingObjects struct {
	admission.ObjectInterfaces
	defaulter runtime.ObjectDefaulter
}

func (o defaultingObjects) GetObjectDefaulter() runtime.ObjectDefaulter { return o.defaulter }
