package policysuite

// Differential runs (`kadmit test --server`): each suite runs offline as
// `kadmit test` does, and each of its tests is also sent to a real API
// server as a server-side dry run (dryRun=All) with the suite's policies
// installed, and every difference between the two outcomes is reported.
// It is how a user proves in CI that the offline answer is the cluster's.
// The model, and the differential e2e that shares this code, is
// test/e2e/celdiff.
//
// Install semantics (docs/policies-cel.md, "Against an API server"): the
// cluster is meant to be disposable. For each suite kadmit creates the
// suite's params, then its policies, then their bindings, exactly as
// written in the files (the API server parses them, not kadmit; a
// MutatingAdmissionPolicy is sent in the version the server serves); it
// creates every namespace the tests use that does not exist (with the
// suite's labels) and, for UPDATE and DELETE, each old object for real
// before the policies are in place. An object of the same name that
// already exists is never overwritten: installing the suite fails. It
// then waits until the API server enforces the set, sends each test,
// and removes everything it created in reverse order, also when ctx is
// cancelled (Ctrl-C): the removal runs on its own bounded context.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/manifests"
)

// Defaults of ServerOptions.
const (
	DefaultRequestTimeout = 10 * time.Second
	DefaultReadyTimeout   = 60 * time.Second
	DefaultMaxObjects     = 1000
	// cleanupTimeout bounds the removal of what a suite installed, which
	// runs on its own context so that Ctrl-C still cleans up.
	cleanupTimeout = 60 * time.Second
	// maxObjectPaths bounds the fields of one expect.object compared.
	maxObjectPaths = 10000
	// maxUserClients bounds the cached impersonating clients.
	maxUserClients = 256
)

// transientDenials are denials the API server gives while it has not
// finished wiring a policy's paramKind, and retries on its own
// (k8s.io/apiserver v0.37.1 pkg/admission/plugin/policy/generic:
// policy_source.go:415 and policy_dispatcher.go:292, :319); a request
// denied so is sent again until the readiness deadline.
var transientDenials = []string{
	"failed to find resource referenced by paramKind",
	"not yet synced to use for admission",
	"` not known",
}

// ServerOptions bound a differential run.
type ServerOptions struct {
	// Load are the options the suites' policies are loaded with offline.
	Load celpolicy.LoadOptions
	// RequestTimeout bounds each request to the API server
	// (DefaultRequestTimeout when zero).
	RequestTimeout time.Duration
	// ReadyTimeout bounds the wait, per suite, until the API server
	// enforces the installed policies (DefaultReadyTimeout when zero).
	ReadyTimeout time.Duration
	// MaxObjects bounds the objects one suite installs: policies,
	// bindings, params, namespaces and old objects (DefaultMaxObjects
	// when zero).
	MaxObjects int
	// Log receives progress and cleanup problems, one line each (nil:
	// discarded).
	Log io.Writer
}

// Server sends suites' tests to one API server. Its methods are not safe
// for concurrent use: requests are sequential.
type Server struct {
	cfg    *rest.Config
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
	opts   ServerOptions
	// users caches a dynamic client per impersonated userInfo.
	users map[string]dynamic.Interface
	// namespaces kadmit created in this run: deleted by Close.
	namespaces []string
	// keepers are the param-kind keepers installed in this run (see
	// keepParamKinds), by plugin and paramKind; keeperUndo deletes them,
	// run in reverse by Close.
	keepers    map[string]bool
	keeperUndo []func(context.Context) error
}

// warningsKey carries the *[]string a request's warnings are collected
// in, so that each request (and each impersonating client) gets its own.
type warningsKey struct{}

type warningCollector struct{ mu sync.Mutex }

func (w *warningCollector) HandleWarningHeaderWithContext(ctx context.Context, code int, _ string, text string) {
	if code != 299 || text == "" {
		return
	}
	if l, ok := ctx.Value(warningsKey{}).(*[]string); ok {
		w.mu.Lock()
		*l = append(*l, text)
		w.mu.Unlock()
	}
}

// NewServer returns a Server talking to the API server of cfg (which is
// copied). Errors are about building the clients.
func NewServer(cfg *rest.Config, opts ServerOptions) (*Server, error) {
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = DefaultRequestTimeout
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = DefaultReadyTimeout
	}
	if opts.MaxObjects <= 0 {
		opts.MaxObjects = DefaultMaxObjects
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	c := rest.CopyConfig(cfg)
	c.Timeout = opts.RequestTimeout
	c.WarningHandler = nil
	c.WarningHandlerWithContext = &warningCollector{}
	if c.QPS == 0 {
		c.QPS, c.Burst = 50, 100
	}
	dyn, err := dynamic.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("API server discovery client: %w", err)
	}
	return &Server{cfg: c, dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)),
		opts: opts, users: map[string]dynamic.Interface{}}, nil
}

// Close deletes the namespaces this Server created. The error lists those
// it could not delete.
func (sv *Server) Close(ctx context.Context) error {
	var errs []error
	for i := len(sv.keeperUndo) - 1; i >= 0; i-- {
		if err := sv.keeperUndo[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	sv.keepers, sv.keeperUndo = nil, nil
	for i := len(sv.namespaces) - 1; i >= 0; i-- {
		ns := sv.namespaces[i]
		c, cancel := context.WithTimeout(ctx, sv.opts.RequestTimeout)
		err := sv.dyn.Resource(nsGVR).Delete(c, ns, metav1.DeleteOptions{})
		cancel()
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete namespace %s: %w", ns, err))
		}
	}
	sv.namespaces = nil
	return errors.Join(errs...)
}

var nsGVR = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}

// ServerRequest is one request sent as a server-side dry run.
type ServerRequest struct {
	Resource    schema.GroupVersionResource
	SubResource string
	Namespace   string
	Name        string
	Operation   admission.Operation // CREATE, UPDATE or DELETE
	// Object is the request's object (CREATE, UPDATE).
	Object *unstructured.Unstructured
	// User, when set, is impersonated (Impersonate-User, -Group, -Uid,
	// -Extra); otherwise the request is the kubeconfig's user's.
	User *rest.ImpersonationConfig
	// Options is the test's options object as JSON (CreateOptions,
	// UpdateOptions or DeleteOptions: fieldManager, fieldValidation,
	// propagationPolicy, gracePeriodSeconds, preconditions ...), sent as
	// the request's query parameters; its dryRun is always [All].
	Options []byte
}

// ServerOutcome is what the API server answered.
type ServerOutcome struct {
	Allowed bool
	// Code and Message are the denial's status (zero when allowed).
	Code    int32
	Message string
	// Warnings are the response's warnings, in order.
	Warnings []string
	// Object is the admitted object (allowed CREATE and UPDATE).
	Object map[string]any
}

// Send sends r as a dry run (dryRun=All: admission runs in full, nothing
// is stored) and returns the answer. A denial or any other API status is
// an outcome; the error is for a request that got no API answer.
func (sv *Server) Send(ctx context.Context, r *ServerRequest) (ServerOutcome, error) {
	dyn, err := sv.client(r.User)
	if err != nil {
		return ServerOutcome{}, err
	}
	var warnings []string
	ctx = context.WithValue(ctx, warningsKey{}, &warnings)
	ctx, cancel := context.WithTimeout(ctx, sv.opts.RequestTimeout)
	defer cancel()
	var c dynamic.ResourceInterface = dyn.Resource(r.Resource)
	if r.Namespace != "" {
		c = dyn.Resource(r.Resource).Namespace(r.Namespace)
	}
	var sub []string
	if r.SubResource != "" {
		sub = []string{r.SubResource}
	}
	var res *unstructured.Unstructured
	dry := []string{metav1.DryRunAll}
	// decode reads the test's options into opts (nothing when none).
	decode := func(opts any) error {
		if len(r.Options) == 0 {
			return nil
		}
		if err := json.Unmarshal(r.Options, opts); err != nil {
			return fmt.Errorf("%s %s %s/%s: options: %w", r.Operation, r.Resource.Resource, r.Namespace, r.Name, err)
		}
		return nil
	}
	switch r.Operation {
	case admission.Create:
		var o metav1.CreateOptions
		if err := decode(&o); err != nil {
			return ServerOutcome{}, err
		}
		o.DryRun = dry
		res, err = c.Create(ctx, r.Object.DeepCopy(), o, sub...)
	case admission.Update:
		var o metav1.UpdateOptions
		if err := decode(&o); err != nil {
			return ServerOutcome{}, err
		}
		o.DryRun = dry
		res, err = c.Update(ctx, r.Object.DeepCopy(), o, sub...)
	case admission.Delete:
		var o metav1.DeleteOptions
		if err := decode(&o); err != nil {
			return ServerOutcome{}, err
		}
		o.DryRun = dry
		err = c.Delete(ctx, r.Name, o, sub...)
	default:
		return ServerOutcome{}, fmt.Errorf("operation %s cannot be sent as a dry run", r.Operation)
	}
	o := ServerOutcome{Warnings: warnings}
	if err != nil {
		var se apierrors.APIStatus
		if !errors.As(err, &se) {
			return o, fmt.Errorf("%s %s %s/%s: %w", r.Operation, r.Resource.Resource, r.Namespace, r.Name, err)
		}
		st := se.Status()
		o.Code, o.Message = st.Code, st.Message
		return o, nil
	}
	o.Allowed = true
	if res != nil {
		o.Object = res.Object
	}
	return o, nil
}

func (sv *Server) client(u *rest.ImpersonationConfig) (dynamic.Interface, error) {
	if u == nil {
		return sv.dyn, nil
	}
	key, _ := json.Marshal(u)
	if d, ok := sv.users[string(key)]; ok {
		return d, nil
	}
	c := rest.CopyConfig(sv.cfg)
	c.Impersonate = *u
	d, err := dynamic.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("client impersonating %s: %w", u.UserName, err)
	}
	// Impersonation wraps the shared TLS transport (the key of client-go
	// v0.37.1 transport/cache.go tlsCacheKey leaves it out), so a client
	// is cheap; the cache is bounded all the same.
	if len(sv.users) >= maxUserClients {
		clear(sv.users)
	}
	sv.users[string(key)] = d
	return d, nil
}

// Mapping returns the resource of gvk the API server serves and whether
// it is namespaced, reading discovery again once when gvk is not known
// (a CRD just created).
func (sv *Server) Mapping(gvk schema.GroupVersionKind) (schema.GroupVersionResource, bool, error) {
	m, err := sv.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		sv.mapper.Reset()
		if m, err = sv.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			return schema.GroupVersionResource{}, false, fmt.Errorf("%s is not served by the API server: %w", gvk, err)
		}
	}
	return m.Resource, m.Scope.Name() == meta.RESTScopeNameNamespace, nil
}

// Create creates u for real, sets u's resourceVersion to the stored
// one, and returns its deletion. An object of the same name that exists
// already is an error wrapping ErrExists: kadmit never overwrites an
// object it did not create.
func (sv *Server) Create(ctx context.Context, u *unstructured.Unstructured) (func(context.Context) error, error) {
	gvr, namespaced, err := sv.Mapping(u.GroupVersionKind())
	if err != nil {
		return nil, err
	}
	var c dynamic.ResourceInterface = sv.dyn.Resource(gvr)
	if namespaced {
		c = sv.dyn.Resource(gvr).Namespace(u.GetNamespace())
	}
	what := describe(u)
	res, err := sv.create(ctx, c, u)
	if err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("%s: %w", what, ErrExists)
		}
		return nil, fmt.Errorf("create %s: %w", what, err)
	}
	u.SetResourceVersion(res.GetResourceVersion())
	return func(ctx context.Context) error {
		// Retried until ctx ends: the API server enforces a deleted
		// policy until its informer catches up, so the suite's own
		// policy may still deny deleting an old object it protects.
		var err error
		for {
			rctx, cancel := context.WithTimeout(ctx, sv.opts.RequestTimeout)
			err = c.Delete(rctx, u.GetName(), metav1.DeleteOptions{})
			cancel()
			if err == nil || apierrors.IsNotFound(err) {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("delete %s: %w", what, err)
			case <-time.After(time.Second):
			}
		}
	}, nil
}

// grantUsers lets each user a test impersonates make that test's request:
// admission is under test, not authorization, and the API server
// authorizes a request (dry run or not) before admission, so an
// impersonated user without RBAC would get "cannot create resource" where
// the policies were to decide. For the suite's run kadmit creates one Role
// per namespace (one ClusterRole for cluster-scoped requests) with exactly
// the verbs and resources (with subresource) of the tests that
// impersonate, and a binding to those users, and returns their deletion.
// The kubeconfig's user must be allowed to grant them (RBAC's escalation
// check: it holds them itself).
func (sv *Server) grantUsers(ctx context.Context, s *Suite, reqs []*ServerRequest) ([]func(context.Context) error, error) {
	type scope struct {
		rules map[string]map[string]bool // "group\x00resource" -> verbs
		users map[string]bool
	}
	scopes := map[string]*scope{} // namespace ("" cluster-wide)
	for _, r := range reqs {
		if r == nil || r.User == nil || r.User.UserName == "" {
			continue
		}
		sc := scopes[r.Namespace]
		if sc == nil {
			sc = &scope{rules: map[string]map[string]bool{}, users: map[string]bool{}}
			scopes[r.Namespace] = sc
		}
		res := r.Resource.Resource
		if r.SubResource != "" {
			res += "/" + r.SubResource
		}
		key := r.Resource.Group + "\x00" + res
		if sc.rules[key] == nil {
			sc.rules[key] = map[string]bool{}
		}
		sc.rules[key][strings.ToLower(string(r.Operation))] = true
		sc.users[r.User.UserName] = true
	}
	sum := sha256.Sum256([]byte(s.file))
	name := "kadmit-test-grant-" + hex.EncodeToString(sum[:6])
	var undo []func(context.Context) error
	for _, ns := range slices.Sorted(maps.Keys(scopes)) {
		sc := scopes[ns]
		var rules []any
		for _, key := range slices.Sorted(maps.Keys(sc.rules)) {
			group, res, _ := strings.Cut(key, "\x00")
			rules = append(rules, map[string]any{"apiGroups": []any{group}, "resources": []any{res},
				"verbs": toAnySlice(slices.Sorted(maps.Keys(sc.rules[key])))})
		}
		var subjects []any
		for _, u := range slices.Sorted(maps.Keys(sc.users)) {
			// A User subject matches by name, service account
			// usernames (system:serviceaccount:...) included.
			subjects = append(subjects, map[string]any{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": u})
		}
		role, binding := "ClusterRole", "ClusterRoleBinding"
		meta := map[string]any{"name": name}
		if ns != "" {
			role, binding = "Role", "RoleBinding"
			meta = map[string]any{"name": name, "namespace": ns}
		}
		for _, u := range []*unstructured.Unstructured{
			{Object: map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": role, "metadata": meta, "rules": rules}},
			{Object: map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": binding, "metadata": maps.Clone(meta),
				"roleRef": map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": role, "name": name}, "subjects": subjects}},
		} {
			d, err := sv.Create(ctx, u)
			if err != nil {
				return undo, fmt.Errorf("granting the impersonated users their tests' requests: %w", err)
			}
			undo = append(undo, d)
		}
	}
	return undo, nil
}

func toAnySlice(ss []string) []any {
	out := make([]any, len(ss))
	for i, v := range ss {
		out[i] = v
	}
	return out
}

// removedPolicyLinger bounds how long an install retries a denial by an
// admission policy: the API server enforces a policy an earlier suite
// removed until its policy source refreshes (every second, k8s.io/apiserver
// v0.37.1 pkg/admission/plugin/policy/generic/policy_source.go), so a
// suite that denies namespaces may refuse the next suite's namespace for
// that long. A policy that still denies after this is the cluster's own.
const removedPolicyLinger = 5 * time.Second

// create creates u through c, retrying for removedPolicyLinger while an
// admission policy denies it (see there).
func (sv *Server) create(ctx context.Context, c dynamic.ResourceInterface, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	deadline := time.Now().Add(removedPolicyLinger)
	for {
		rctx, cancel := context.WithTimeout(ctx, sv.opts.RequestTimeout)
		res, err := c.Create(rctx, u, metav1.CreateOptions{})
		cancel()
		if err == nil || !deniedByPolicy(err) || time.Now().After(deadline) {
			return res, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// deniedByPolicy reports whether err is a ValidatingAdmissionPolicy's or
// MutatingAdmissionPolicy's denial.
func deniedByPolicy(err error) bool {
	return (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) && strings.Contains(err.Error(), "AdmissionPolicy '")
}

// ErrExists is wrapped by the error about an object kadmit would install
// that exists in the cluster already.
var ErrExists = errors.New("already exists in the cluster (kadmit test --server installs the suite's objects itself and never overwrites one; use a disposable cluster, or delete it)")

func describe(u *unstructured.Unstructured) string {
	if u.GetNamespace() != "" {
		return fmt.Sprintf("%s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
	}
	return fmt.Sprintf("%s %s", u.GetKind(), u.GetName())
}

// PolicyDocuments reads the policy files at paths as written: the
// admissionregistration.k8s.io policy and binding kinds, bindings last,
// and every other object as a param, at most max objects. A
// MutatingAdmissionPolicy (binding) is sent in mapVersion, the version
// the server serves (the fields are the same across v1alpha1, v1beta1
// and v1); a ValidatingAdmissionPolicy (binding) in v1.
func PolicyDocuments(paths []string, mapVersion string, max int) (policies, params []*unstructured.Unstructured, err error) {
	var bindings []*unstructured.Unstructured
	n := 0
	for _, p := range paths {
		files, err := manifests.Files(p, nil)
		if err != nil {
			return nil, nil, err
		}
		for _, f := range files {
			fh, err := os.Open(f)
			if err != nil {
				return nil, nil, err
			}
			err = manifests.Objects(fh, func(obj []byte) error {
				if n++; n > max {
					return fmt.Errorf("more than %d objects", max)
				}
				u := &unstructured.Unstructured{}
				if err := u.UnmarshalJSON(obj); err != nil {
					return err
				}
				gvk := u.GroupVersionKind()
				if gvk.Group != "admissionregistration.k8s.io" {
					params = append(params, u)
					return nil
				}
				switch gvk.Kind {
				case "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
					u.SetAPIVersion("admissionregistration.k8s.io/v1")
				case "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding":
					u.SetAPIVersion("admissionregistration.k8s.io/" + mapVersion)
				default:
					params = append(params, u)
					return nil
				}
				if strings.HasSuffix(gvk.Kind, "Binding") {
					bindings = append(bindings, u)
				} else {
					policies = append(policies, u)
				}
				return nil
			})
			fh.Close()
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", f, err)
			}
		}
	}
	return append(policies, bindings...), params, nil
}

// MutatingVersion is the admissionregistration.k8s.io version the API
// server serves MutatingAdmissionPolicy in (v1 from 1.36, v1beta1 or
// v1alpha1 before, when enabled).
func (sv *Server) MutatingVersion() (string, error) {
	gk := schema.GroupKind{Group: "admissionregistration.k8s.io", Kind: "MutatingAdmissionPolicy"}
	for _, v := range []string{"v1", "v1beta1", "v1alpha1"} {
		if _, err := sv.mapper.RESTMapping(gk, v); err == nil {
			return v, nil
		}
	}
	return "", errors.New("the API server does not serve MutatingAdmissionPolicy (before 1.36 it needs the MutatingAdmissionPolicy feature gate and its API version enabled)")
}

// WaitFor calls cond every second until it returns true, ctx ends or
// limit passes (an error naming what).
func WaitFor(ctx context.Context, what string, limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s", what, limit)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-time.After(time.Second):
		}
	}
	return nil
}

// RunServer runs suite s offline, as RunWith, and against the API server:
// it installs the suite (see the install semantics above), waits until
// the API server enforces it, sends each test as a dry run, compares, and
// removes what it installed. Each Result has Server set. The error wraps
// ErrInput for a suite that cannot be loaded, ErrExists for an object that
// would be overwritten, and is otherwise about the API server (not
// reachable, a param kind it does not serve, policies not in effect in
// time, a cleanup that failed).
func (sv *Server) RunServer(ctx context.Context, s *Suite) (results []Result, err error) {
	e, err := s.engine(sv.opts.Load)
	if err != nil {
		return nil, err
	}
	set := e.Set()
	results, runs, err := s.runOffline(ctx, e, true)
	if err != nil {
		return nil, err
	}
	for i := range results {
		results[i].Server = &ServerCheck{}
	}
	mapVersion := "v1"
	if len(set.Mutating) > 0 {
		if mapVersion, err = sv.MutatingVersion(); err != nil {
			return nil, fmt.Errorf("%s: %w", s.file, err)
		}
	}
	policies, params, err := PolicyDocuments(s.policyPaths(), mapVersion, sv.opts.MaxObjects)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInput, s.file, err)
	}

	var undo []func(context.Context) error
	defer func() {
		// Removal on its own context: after Ctrl-C, ctx is done.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		var errs []error
		for i := len(undo) - 1; i >= 0; i-- {
			if e := undo[i](cctx); e != nil {
				fmt.Fprintf(sv.opts.Log, "kadmit test --server: cleanup: %v\n", e)
				errs = append(errs, e)
			}
		}
		if len(errs) > 0 {
			err = errors.Join(err, fmt.Errorf("%s: cleanup: %w", s.file, errors.Join(errs...)))
		}
	}()
	count := len(policies) + len(params)
	bound := func() error {
		if count++; count > sv.opts.MaxObjects {
			return fmt.Errorf("%s: more than %d objects to install", s.file, sv.opts.MaxObjects)
		}
		return nil
	}

	// The requests, and the namespaces they need.
	reqs := make([]*ServerRequest, len(runs))
	for i, r := range runs {
		sr, note, err := sv.serverRequest(r)
		if err != nil {
			return nil, fmt.Errorf("%s: tests[%d] (%s): %w", s.file, i, r.test.Name, err)
		}
		if note != "" {
			results[i].Server.Notes = append(results[i].Server.Notes, note)
			continue
		}
		reqs[i] = sr
		if len(r.test.Expect.AuditAnnotations) > 0 {
			results[i].Server.Notes = append(results[i].Server.Notes,
				"expect.auditAnnotations not compared: a client cannot read them (they are in the API server's audit log)")
		}
	}
	var paramNamespaces []string
	for _, p := range params {
		if ns := p.GetNamespace(); ns != "" {
			paramNamespaces = append(paramNamespaces, ns)
		}
	}
	if err := sv.ensureNamespaces(ctx, s, reqs, paramNamespaces, bound); err != nil {
		return nil, fmt.Errorf("%s: %w", s.file, err)
	}
	for _, p := range params {
		d, err := sv.Create(ctx, p.DeepCopy())
		if err != nil {
			return nil, fmt.Errorf("%s: param: %w", s.file, err)
		}
		undo = append(undo, d)
	}
	grants, err := sv.grantUsers(ctx, s, reqs)
	undo = append(undo, grants...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.file, err)
	}
	// Old objects exist for real before the policies are in place (which
	// could deny or change their creation); tests sharing one share it.
	type stored struct {
		written         map[string]any
		resourceVersion string
	}
	created := map[string]stored{}
	for i, r := range runs {
		if reqs[i] == nil || r.req.OldObject == nil {
			continue
		}
		old := &unstructured.Unstructured{}
		if err := old.UnmarshalJSON(r.req.OldObject); err != nil {
			return nil, fmt.Errorf("%s: tests[%d] (%s): oldObject: %w", s.file, i, r.test.Name, err)
		}
		key := reqs[i].Resource.String() + "/" + old.GetNamespace() + "/" + old.GetName()
		prev, ok := created[key]
		switch {
		case ok && !reflect.DeepEqual(prev.written, old.Object):
			results[i].Server.Diff = append(results[i].Server.Diff, "not sent: another test of the suite uses a different old object of the same name; the API server holds one")
			reqs[i] = nil
			continue
		case ok:
			setResourceVersion(reqs[i], prev.resourceVersion)
			continue
		}
		if err := bound(); err != nil {
			return nil, err
		}
		obj := old.DeepCopy()
		d, err := sv.Create(ctx, obj)
		if err != nil {
			if errors.Is(err, ErrExists) {
				return nil, fmt.Errorf("%s: tests[%d] (%s): old object: %w", s.file, i, r.test.Name, err)
			}
			results[i].Server.Diff = append(results[i].Server.Diff, fmt.Sprintf("not sent: creating the old object: %v", err))
			reqs[i] = nil
			continue
		}
		created[key] = stored{written: old.Object, resourceVersion: obj.GetResourceVersion()}
		setResourceVersion(reqs[i], obj.GetResourceVersion())
		undo = append(undo, d)
	}

	// Baseline: each request without the suite's policies. Its warnings
	// are the API server's own (deprecations, pod spec advice), not the
	// policies', and are set aside.
	baseline := make([][]string, len(reqs))
	for i, r := range reqs {
		if r == nil {
			continue
		}
		o, err := sv.Send(ctx, r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.file, err)
		}
		baseline[i] = o.Warnings
	}

	// The policies, then a probe: policies of kadmit's own, created last,
	// that warn about (and mutate) one dry-run namespace creation. The API
	// server compiles every policy and binding its informers hold at once
	// (k8s.io/apiserver v0.37.1 pkg/admission/plugin/policy/generic/
	// policy_source.go refreshPolicies), and a watch delivers objects of
	// one resource in order, so once the probe is enforced the suite's
	// policies are too.
	if err := sv.keepParamKinds(ctx, set, mapVersion); err != nil {
		return nil, fmt.Errorf("%s: %w", s.file, err)
	}
	for _, p := range policies {
		d, err := sv.Create(ctx, p.DeepCopy())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.file, err)
		}
		undo = append(undo, d)
	}
	probes, err := probeObjects(len(set.Mutating) > 0, mapVersion)
	if err != nil {
		return nil, err
	}
	for _, p := range probes.objects {
		d, err := sv.Create(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("%s: readiness probe: %w", s.file, err)
		}
		undo = append(undo, d)
	}
	fmt.Fprintf(sv.opts.Log, "kadmit test --server: %s: %d policies and bindings, %d params installed; waiting until the API server enforces them\n", s.Metadata.Name, len(policies), len(params))
	if err := WaitFor(ctx, "the suite's policies in effect", sv.opts.ReadyTimeout, func() bool { return sv.probed(ctx, probes) }); err != nil {
		return nil, fmt.Errorf("%s: %w (the readiness probe's last answer: %s)", s.file, err, probes.last)
	}

	deadline := time.Now().Add(sv.opts.ReadyTimeout)
	for i, r := range reqs {
		if r == nil {
			continue
		}
		var o ServerOutcome
		for {
			if o, err = sv.Send(ctx, r); err != nil {
				return nil, fmt.Errorf("%s: %w", s.file, err)
			}
			if o.Allowed || !transient(o.Message) || time.Now().After(deadline) {
				break
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("%s: %w", s.file, ctx.Err())
			case <-time.After(time.Second):
			}
		}
		o.Warnings = without(o.Warnings, baseline[i])
		d := diffOutcomes(runs[i], o)
		results[i].Server.Diff = append(results[i].Server.Diff, d...)
		if r := runs[i]; r.dry != nil && !decidesAlike(r.d, r.dry) {
			results[i].Server.Notes = append(results[i].Server.Notes, "sent as a dry run, as every --server request is, and the suite's policies decide it differently as one (request.dryRun): "+
				"the server's answer is compared with kadmit's for the same request as a dry run ("+side(r.dry.Allowed, code(r.dry), message(r.dry))+")")
		}
		if len(d) > 0 && len(params) > 0 && strings.Contains(o.Message, noParamsFound) {
			results[i].Server.Notes = append(results[i].Server.Notes, staleParamInformer)
		}
	}
	return results, nil
}

// decidesAlike reports whether two offline decisions agree in allowed,
// code and message.
func decidesAlike(a, b *celpolicy.Decision) bool {
	return a.Allowed == b.Allowed && code(a) == code(b) && message(a) == message(b)
}

func code(d *celpolicy.Decision) int32 {
	if d.Allowed || d.Status == nil {
		return 0
	}
	return d.Status.Code
}

func message(d *celpolicy.Decision) string {
	if d.Allowed || d.Status == nil {
		return ""
	}
	return d.Status.Message
}

// noParamsFound is the API server's denial when a binding with
// parameterNotFoundAction Deny finds no param (k8s.io/apiserver v0.37.1
// pkg/admission/plugin/policy/generic/policy_dispatcher.go:401).
const noParamsFound = "no params found for policy binding"

// staleParamInformer explains a server that finds none of the params the
// suite installed: a known kube-apiserver bug, not a difference in the
// policy's semantics.
const staleParamInformer = "the API server found no param although kadmit installed the suite's: when the paramKind is a built-in kind (ConfigMap, Secret, ...), " +
	"kube-apiserver stops that kind's param informer for good once no binding uses it for a second, e.g. after an earlier run removed its suite " +
	"(kubernetes/kubernetes#130887, #133827); restart the API server, or keep a binding on that paramKind in the cluster, and run again"

// setResourceVersion gives an UPDATE without metadata.resourceVersion the
// stored old object's, as a client reading before writing sends: custom
// resources refuse an update without one (apiextensions-apiserver
// customResourceStrategy.AllowUnconditionalUpdate is false).
func setResourceVersion(r *ServerRequest, rv string) {
	if r.Object != nil && r.Object.GetResourceVersion() == "" {
		r.Object.SetResourceVersion(rv)
	}
}

func transient(msg string) bool {
	for _, t := range transientDenials {
		if strings.Contains(msg, t) {
			return true
		}
	}
	return false
}

// without returns ws less one occurrence of each of base.
func without(ws, base []string) []string {
	out := []string{}
	left := slices.Clone(base)
	for _, w := range ws {
		if i := slices.Index(left, w); i >= 0 {
			left = slices.Delete(left, i, i+1)
			continue
		}
		out = append(out, w)
	}
	return out
}

// serverRequest is the dry run of an offline request, or a note saying
// why the test is not sent.
func (sv *Server) serverRequest(r offline) (*ServerRequest, string, error) {
	req := r.req
	if req.Operation == admission.Connect {
		return nil, "not sent: CONNECT requests (exec, attach, port-forward) have no dry run", nil
	}
	gvr, namespaced, err := sv.Mapping(req.Kind)
	if err != nil {
		if req.SubResource != "" {
			// A subresource's own kind (autoscaling/v1 Scale for
			// deployments/scale) is not a resource: the request would
			// need the parent object, which the test does not give.
			return nil, fmt.Sprintf("not sent: %s %s is the kind of a %s subresource request, not a resource the API server serves; such a request needs the parent object, which the test does not give", req.Kind.GroupVersion(), req.Kind.Kind, req.SubResource), nil
		}
		return nil, "", err
	}
	if r.test.Resource != "" {
		gvr.Resource = r.test.Resource
	}
	sr := &ServerRequest{Resource: gvr, SubResource: req.SubResource, Name: req.Name, Operation: req.Operation, Options: req.Options}
	if namespaced {
		if req.Namespace == "" {
			return nil, "not sent: the object of a namespaced kind has no metadata.namespace", nil
		}
		sr.Namespace = req.Namespace
	}
	if req.Object != nil {
		sr.Object = &unstructured.Unstructured{}
		if err := sr.Object.UnmarshalJSON(req.Object); err != nil {
			return nil, "", fmt.Errorf("object: %w", err)
		}
	}
	if u := r.test.UserInfo; u != nil {
		if u.Username == "" {
			return nil, "not sent: userInfo has no username, and the API server impersonates a user only", nil
		}
		ic := &rest.ImpersonationConfig{UserName: u.Username, UID: u.UID, Groups: u.Groups}
		if len(u.Extra) > 0 {
			ic.Extra = map[string][]string{}
			for k, v := range u.Extra {
				ic.Extra[k] = v
			}
		}
		sr.User = ic
	}
	return sr, "", nil
}

// ensureNamespaces creates the namespaces the requests (and the params,
// extra) are in that do not exist, with the labels the suite gives them. A namespace this Server
// created for an earlier suite gets exactly this suite's labels; one that
// existed before must have the suite's labels already (kadmit does not
// change it).
func (sv *Server) ensureNamespaces(ctx context.Context, s *Suite, reqs []*ServerRequest, extra []string, bound func() error) error {
	want := map[string]map[string]string{}
	for _, r := range reqs {
		if r != nil && r.Namespace != "" {
			want[r.Namespace] = nil
		}
	}
	for _, ns := range extra {
		want[ns] = nil
	}
	for i := range s.Namespaces {
		want[s.Namespaces[i].Name] = s.Namespaces[i].Labels
	}
	names := slices.Sorted(maps.Keys(want))
	c := sv.dyn.Resource(nsGVR)
	for _, name := range names {
		labels := want[name]
		rctx, cancel := context.WithTimeout(ctx, sv.opts.RequestTimeout)
		cur, err := c.Get(rctx, name, metav1.GetOptions{})
		cancel()
		switch {
		case apierrors.IsNotFound(err):
			if err := bound(); err != nil {
				return err
			}
			u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace",
				"metadata": map[string]any{"name": name}}}
			u.SetLabels(labels)
			if _, err := sv.create(ctx, c, u); err != nil {
				return fmt.Errorf("create namespace %s: %w", name, err)
			}
			sv.namespaces = append(sv.namespaces, name)
			continue
		case err != nil:
			return fmt.Errorf("namespace %s: %w", name, err)
		}
		if phase, _, _ := unstructured.NestedString(cur.Object, "status", "phase"); phase == "Terminating" {
			return fmt.Errorf("namespace %s is terminating", name)
		}
		have := cur.GetLabels()
		if !slices.Contains(sv.namespaces, name) {
			for k, v := range labels {
				if hv, ok := have[k]; !ok || hv != v {
					return fmt.Errorf("namespace %s exists with labels %v, the suite gives it %v: kadmit does not change a namespace it did not create", name, have, labels)
				}
			}
			continue
		}
		// Created for an earlier suite: exactly this suite's labels,
		// as offline (none when the suite does not declare it).
		want := map[string]string{corev1.LabelMetadataName: name}
		for k, v := range labels {
			want[k] = v
		}
		if maps.Equal(have, want) {
			continue
		}
		cur.SetLabels(want)
		rctx, cancel = context.WithTimeout(ctx, sv.opts.RequestTimeout)
		_, err = c.Update(rctx, cur, metav1.UpdateOptions{})
		cancel()
		if err != nil {
			return fmt.Errorf("update namespace %s: %w", name, err)
		}
	}
	return nil
}

// probes are kadmit's own readiness policies and the namespace whose
// dry-run creation shows them in effect: a MutatingAdmissionPolicy (when
// the suite has mutating policies) that labels it, and a
// ValidatingAdmissionPolicy bound with the Warn action whose warning says
// whether the label is there (validating policies see the mutated
// object). A warning, unlike a denial, is not hidden by a suite's policy
// that denies the same request: the API server evaluates every
// validating policy and returns the first denial only
// (k8s.io/apiserver v0.37.1 pkg/admission/plugin/policy/validating/
// dispatcher.go), with every warning.
type probes struct {
	objects   []*unstructured.Unstructured
	namespace string // the probe's name: policies, bindings, namespace
	mutating  bool
	// last is the last probe answer that was not the one awaited.
	last string
}

const (
	probeLabel   = "kadmit.io/probe"
	probeMessage = "kadmit readiness probe: "
)

func probeObjects(mutating bool, mapVersion string) (*probes, error) {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	name := "kadmit-test-probe-" + hex.EncodeToString(b)
	p := &probes{namespace: name, mutating: mutating}
	rules := []any{map[string]any{"apiGroups": []any{""}, "apiVersions": []any{"v1"}, "operations": []any{"CREATE"}, "resources": []any{"namespaces"}}}
	match := []any{map[string]any{"name": "probe", "expression": fmt.Sprintf("object.metadata.name == %q", name)}}
	obj := func(apiVersion, kind string, spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind,
			"metadata": map[string]any{"name": name}, "spec": spec}}
	}
	var bindings []*unstructured.Unstructured
	if mutating {
		av := "admissionregistration.k8s.io/" + mapVersion
		p.objects = append(p.objects, obj(av, "MutatingAdmissionPolicy", map[string]any{
			"failurePolicy":      "Fail",
			"reinvocationPolicy": "Never",
			"matchConstraints":   map[string]any{"resourceRules": rules},
			"matchConditions":    match,
			"mutations": []any{map[string]any{"patchType": "ApplyConfiguration", "applyConfiguration": map[string]any{
				"expression": fmt.Sprintf(`Object{metadata: Object.metadata{labels: {%q: "in-effect"}}}`, probeLabel)}}},
		}))
		bindings = append(bindings, obj(av, "MutatingAdmissionPolicyBinding", map[string]any{"policyName": name}))
	}
	p.objects = append(p.objects, obj("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", map[string]any{
		"failurePolicy":    "Fail",
		"matchConstraints": map[string]any{"resourceRules": rules},
		"matchConditions":  match,
		"validations": []any{map[string]any{"expression": "false", "messageExpression": fmt.Sprintf(
			`%q + (has(object.metadata.labels) && %q in object.metadata.labels ? "mutated" : "not mutated")`, probeMessage, probeLabel)}},
	}))
	bindings = append(bindings, obj("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding", map[string]any{
		"policyName": name, "validationActions": []any{"Warn"},
	}))
	// The policies before their bindings.
	p.objects = append(p.objects, bindings...)
	return p, nil
}

// keepParamKinds installs, once per run, a keeper for every paramKind of
// set's policies that the run has not kept yet: a policy of kadmit's own
// with that paramKind, bound with a paramRef, matching nothing (resources
// of the group keeper.kadmit.io, which no API server serves). Close
// removes them. kube-apiserver stops a built-in paramKind's param informer
// for good once no binding uses it for one policy refresh (a second), and
// a later binding that selects its params then finds none
// (kubernetes/kubernetes#130887, open in v1.37.1): without the keepers, a
// suite's cleanup would break every later suite of the run that selects
// params of the same kind. The validating and the mutating plugin each
// have their own informers, so each gets its own keeper. Kinds a CRD
// serves are not affected upstream; keeping them too costs one informer
// the API server has already.
func (sv *Server) keepParamKinds(ctx context.Context, set *celpolicy.Set, mapVersion string) error {
	type need struct {
		mutating bool
		pk       *admissionregistrationv1.ParamKind
	}
	var needs []need
	for _, p := range set.Validating {
		if p.Spec.ParamKind != nil {
			needs = append(needs, need{false, p.Spec.ParamKind})
		}
	}
	for _, p := range set.Mutating {
		if p.Spec.ParamKind != nil {
			needs = append(needs, need{true, p.Spec.ParamKind})
		}
	}
	for _, n := range needs {
		plugin := "validating"
		if n.mutating {
			plugin = "mutating"
		}
		key := plugin + "/" + n.pk.APIVersion + "/" + n.pk.Kind
		if sv.keepers[key] {
			continue
		}
		sum := sha256.Sum256([]byte(key))
		name := "kadmit-test-keep-" + hex.EncodeToString(sum[:6])
		rules := []any{map[string]any{"apiGroups": []any{"keeper.kadmit.io"}, "apiVersions": []any{"v1"}, "operations": []any{"CREATE"}, "resources": []any{"nothings"}}}
		paramKind := map[string]any{"apiVersion": n.pk.APIVersion, "kind": n.pk.Kind}
		paramRef := map[string]any{"selector": map[string]any{}, "parameterNotFoundAction": "Allow"}
		av, kind, spec, bindingSpec := "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", map[string]any{
			"paramKind": paramKind, "matchConstraints": map[string]any{"resourceRules": rules},
			"validations": []any{map[string]any{"expression": "true"}},
		}, map[string]any{"policyName": name, "validationActions": []any{"Deny"}, "paramRef": paramRef}
		if n.mutating {
			av, kind, spec, bindingSpec = "admissionregistration.k8s.io/"+mapVersion, "MutatingAdmissionPolicy", map[string]any{
				"paramKind": paramKind, "matchConstraints": map[string]any{"resourceRules": rules},
				"reinvocationPolicy": "Never",
				"mutations":          []any{map[string]any{"patchType": "JSONPatch", "jsonPatch": map[string]any{"expression": "[]"}}},
			}, map[string]any{"policyName": name, "paramRef": paramRef}
		}
		for _, u := range []*unstructured.Unstructured{
			{Object: map[string]any{"apiVersion": av, "kind": kind, "metadata": map[string]any{"name": name}, "spec": spec}},
			{Object: map[string]any{"apiVersion": av, "kind": kind + "Binding", "metadata": map[string]any{"name": name}, "spec": bindingSpec}},
		} {
			d, err := sv.Create(ctx, u)
			if err != nil {
				return fmt.Errorf("keeping paramKind %s %s: %w", n.pk.APIVersion, n.pk.Kind, err)
			}
			sv.keeperUndo = append(sv.keeperUndo, d)
		}
		if sv.keepers == nil {
			sv.keepers = map[string]bool{}
		}
		sv.keepers[key] = true
	}
	return nil
}

// probed reports whether the API server enforces the probes.
func (sv *Server) probed(ctx context.Context, p *probes) bool {
	o, err := sv.Send(ctx, &ServerRequest{Resource: nsGVR, Name: p.namespace, Operation: admission.Create,
		Object: &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": p.namespace}}}})
	if err != nil {
		p.last = err.Error()
		return false
	}
	want := probeMessage + "not mutated"
	if p.mutating {
		want = probeMessage + "mutated"
	}
	for _, w := range o.Warnings {
		if strings.Contains(w, "'"+p.namespace+"'") && strings.HasSuffix(w, want) {
			return true
		}
	}
	p.last = fmt.Sprintf("%s, warnings %q", side(o.Allowed, o.Code, o.Message), o.Warnings)
	return false
}

// diffOutcomes compares the offline decision with the API server's
// answer: allowed, code and message; the policies' warnings; and, when
// both admitted the object, the fields expect.patched and expect.object
// name. The API server defaults the object before and after admission
// (imagePullPolicy, terminationMessagePath, tolerations, ...): a field
// named is compared as a subset, the server's value may add fields the
// offline one does not have, never change or drop one.
func diffOutcomes(r offline, o ServerOutcome) []string {
	var diff []string
	// The server ran the request as a dry run: compare with kadmit's
	// answer to the same.
	if r.dry != nil {
		r.d, r.req = r.dry, r.dryReq
	}
	d := r.d
	offCode, offMsg := int32(0), ""
	if !d.Allowed && d.Status != nil {
		offCode, offMsg = d.Status.Code, d.Status.Message
	}
	if d.Allowed != o.Allowed || offCode != o.Code || offMsg != o.Message {
		diff = append(diff, fmt.Sprintf("offline %s, server %s", side(d.Allowed, offCode, offMsg), side(o.Allowed, o.Code, o.Message)))
	}
	offWarn := d.Warnings
	if offWarn == nil {
		offWarn = []string{}
	}
	if !slices.Equal(offWarn, o.Warnings) {
		diff = append(diff, fmt.Sprintf("warnings: offline %q, server %q", offWarn, o.Warnings))
	}
	if !d.Allowed || !o.Allowed || o.Object == nil {
		return diff
	}
	offObj := d.Object
	if offObj == nil {
		offObj = r.req.Object
	}
	srvObj, err := json.Marshal(o.Object)
	if err != nil {
		return append(diff, fmt.Sprintf("server object: %v", err))
	}
	var pointers []string
	for p := range r.test.Expect.Patched {
		pointers = append(pointers, p)
	}
	if len(r.test.Expect.Object) > 0 {
		var want any
		if err := json.Unmarshal(r.test.Expect.Object, &want); err == nil {
			pointers = append(pointers, leafPointers(want, "", nil)...)
		}
	}
	sort.Strings(pointers)
	pointers = slices.Compact(pointers)
	for _, p := range pointers {
		segs, err := jsonedit.ParsePointer(p)
		if err != nil {
			continue
		}
		off, _ := jsonedit.NewDoc(offObj).Get(segs...)
		srv, _ := jsonedit.NewDoc(srvObj).Get(segs...)
		if !subsetJSON(off, srv) {
			diff = append(diff, fmt.Sprintf("%s: offline %s, server %s", p, orNothing(off), orNothing(srv)))
		}
	}
	return diff
}

func side(allowed bool, code int32, msg string) string {
	if allowed {
		return "allowed=true"
	}
	return fmt.Sprintf("allowed=false %d %q", code, msg)
}

// serverSet are the fields the API server sets on every stored object;
// expect.object cannot mean them.
var serverSet = map[string]bool{"/metadata/uid": true, "/metadata/creationTimestamp": true,
	"/metadata/resourceVersion": true, "/metadata/generation": true, "/metadata/managedFields": true}

// leafPointers lists the JSON pointers of v's scalar leaves (an empty
// object or array is a leaf), at most maxObjectPaths.
func leafPointers(v any, prefix string, out []string) []string {
	if len(out) >= maxObjectPaths || serverSet[prefix] {
		return out
	}
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 0 {
			return append(out, prefix)
		}
		for k, e := range x {
			out = leafPointers(e, prefix+"/"+strings.NewReplacer("~", "~0", "/", "~1").Replace(k), out)
		}
	case []any:
		if len(x) == 0 {
			return append(out, prefix)
		}
		for i, e := range x {
			out = leafPointers(e, fmt.Sprintf("%s/%d", prefix, i), out)
		}
	default:
		if prefix != "" {
			out = append(out, prefix)
		}
	}
	return out
}

// subsetJSON reports whether the server's value srv has everything the
// offline value off has: equal scalars, equally long arrays of subsets,
// objects with at least off's keys. Nothing (nil or null) matches only
// nothing.
func subsetJSON(off, srv []byte) bool {
	none := func(b []byte) bool { return b == nil || string(bytes.TrimSpace(b)) == "null" }
	if none(off) || none(srv) {
		return none(off) && none(srv)
	}
	var a, b any
	if json.Unmarshal(off, &a) != nil || json.Unmarshal(srv, &b) != nil {
		return false
	}
	return subset(a, b)
}

func subset(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !subset(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !subset(x[i], y[i]) {
				return false
			}
		}
		return true
	default:
		return reflect.DeepEqual(a, b)
	}
}
