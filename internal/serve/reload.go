package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/config"
	"github.com/kadmit/kadmit/internal/metrics"
	"github.com/kadmit/kadmit/internal/policy"
	"github.com/kadmit/kadmit/internal/served"
)

// loadConfig reads the configuration serve starts with: the ConfigMap, the
// file, or the seed profile. An invalid one is an error naming the field.
func loadConfig(ctx context.Context, cs kubernetes.Interface, opts Options) (*config.Configuration, error) {
	switch {
	case opts.ConfigMap != "" && opts.ConfigFile != "":
		return nil, fmt.Errorf("%w: --config and --config-map are exclusive", ErrUsage)
	case opts.ConfigMap != "":
		ns, name, ok := strings.Cut(opts.ConfigMap, "/")
		if !ok || ns == "" || name == "" {
			return nil, fmt.Errorf("%w: --config-map %q: want NAMESPACE/NAME", ErrUsage, opts.ConfigMap)
		}
		return builtin.Config.LoadConfigMap(ctx, cs, ns, name, configKey(opts))
	case opts.ConfigFile != "":
		return builtin.Config.LoadFile(opts.ConfigFile)
	}
	return builtin.Config.Default(), nil
}

func configKey(opts Options) string {
	if opts.ConfigKey != "" {
		return opts.ConfigKey
	}
	return config.DefaultConfigMapKey
}

// reloader builds the hooks of a configuration and, on a live reload, swaps
// them into the server and the registration. Cluster caches (informers for
// policies that read cluster state) live as long as the configuration that
// needs them: a reload that changes what is read starts new ones and stops
// the old.
//
// Three sources make one set of hooks: the configuration (--config-map),
// the --policies files and the policies ConfigMap. Each keeps its latest
// version (the files are read at every build); a change of any of them
// builds all three, so an edit refused because of another source (a valid
// configuration edit while a --policies file does not compile) is applied
// as soon as that other source changes, not only at its own next edit.
type reloader struct {
	// ctx is serve's: cluster caches and reloads end with it.
	ctx context.Context
	// kube returns serve's one client configuration (loaded once).
	kube    func() (*rest.Config, error)
	opts    Options
	log     *slog.Logger
	metrics *metrics.ConfigReloads
	// declaredMetric reports whether the declared policies are served.
	declaredMetric *metrics.DeclaredPolicies
	// serve and register apply new hooks; set once the server and the
	// registration exist.
	serve    func([]*admission.Webhook)
	register func([]admission.Hook)

	// budget bounds the declared policies' decoded objects, one for the
	// process: a reloaded policy set shares it with requests the old
	// set still serves.
	budgetOnce sync.Once
	budget     *celpolicy.Budget

	mu sync.Mutex
	// cfg and policyDocs are the running configuration and documents of
	// --policies-configmap (policyDocs: the last edit that built).
	cfg        *config.Configuration
	policyDocs []celpolicy.Document
	// wantCfg and wantDocs are the latest valid configuration and policies
	// ConfigMap seen (haveDocs: one was seen); they differ from the running
	// ones while they do not build, and are retried at every change.
	wantCfg     *config.Configuration
	wantDocs    []celpolicy.Document
	haveDocs    bool
	cluster     *clustercache.Caches
	clusterKey  string
	stopCluster context.CancelFunc

	// unserved is why no declared policy is served (nil while they are, or
	// when there are none): set when serve starts with a declared set that
	// does not load, cleared by the first that does. Read by /readyz
	// without r.mu, which a build may hold for seconds.
	unserved atomic.Pointer[error]
}

// decodeBudget is the process's one budget for declared policies'
// decoded objects (--policy-decode-bytes-in-flight).
func (r *reloader) decodeBudget() *celpolicy.Budget {
	r.budgetOnce.Do(func() { r.budget = celpolicy.NewBudget(r.opts.PolicyDecodeBytesInFlight) })
	return r.budget
}

// declared reports whether serve runs declared policies (--policies or
// --policies-configmap).
func (r *reloader) declared() bool {
	return len(r.opts.PolicyPaths) > 0 || r.opts.PolicyConfigMap != ""
}

// build returns the hooks of cfg and, with withDeclared, of the declared
// policies (the --policies files, read now, and docs), assembled by
// served.Assemble, starting the cluster caches they need (and waiting for
// them to sync) when they differ from the running ones. Without
// withDeclared a server with declared policies assembles an empty declared
// set, which serves none but keeps the namespace cache the set will need.
// A declared policy error wraps a *served.DeclaredError, prefixed
// "declared policies: ".
func (r *reloader) build(ctx context.Context, cfg *config.Configuration, docs []celpolicy.Document, withDeclared bool) ([]admission.Hook, error) {
	src := served.Sources{Config: cfg, Env: r.env()}
	if r.declared() {
		src.Declared = &served.Declared{Load: declaredLoad(r.opts),
			Options: celpolicy.Options{Budget: r.decodeBudget(), MaxObjectBytes: r.opts.PolicyMaxObjectBytes}}
		if withDeclared {
			src.Declared.Paths, src.Declared.Docs = r.opts.PolicyPaths, docs
		}
	}
	var key string
	var cluster *clustercache.Caches
	var stop context.CancelFunc
	src.Cluster = func(resources []clustercache.Read) (*clustercache.Caches, error) {
		if key = clustercache.Key(resources); key == r.clusterKey {
			cluster = r.cluster
			return cluster, nil
		}
		if len(resources) == 0 {
			return nil, nil
		}
		rc, err := r.kube()
		if err != nil {
			return nil, err
		}
		// The caches outlive this call: they stop when a later reload
		// replaces them or when serve's context ends.
		cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		if cluster, err = clustercache.Start(cctx, rc, resources, r.log); err != nil {
			cancel()
			return nil, err
		}
		context.AfterFunc(ctx, cancel)
		stop = cancel
		return cluster, nil
	}
	policies, err := assemble(src)
	if err != nil {
		if stop != nil {
			stop()
		}
		if de := (*served.DeclaredError)(nil); errors.As(err, &de) {
			return nil, fmt.Errorf("declared policies: %w", err)
		}
		return nil, err
	}
	if key != r.clusterKey {
		if r.stopCluster != nil {
			r.stopCluster()
		}
		r.cluster, r.clusterKey, r.stopCluster = cluster, key, stop
	}
	return policies.Hooks, nil
}

// assemble is served.Assemble; TestReloadReleasesOldEngine records the
// declared policies' engines it builds to prove a reload lets the previous
// one go.
var assemble = served.Assemble

// env is what the built-in policies get besides the cluster caches: the
// log and, with --policies-configmap, the ConfigMap and the loader the
// kadmit-policies guard checks its writes with (declaredHooks, as a start
// and a reload load it, with the --policies files as they are then).
func (r *reloader) env() policy.Env {
	env := policy.Env{Log: r.log}
	if ns, name, err := policyConfigMapName(r.opts); err == nil && r.opts.PolicyConfigMap != "" {
		env.PoliciesConfigMap = &policy.PoliciesConfigMap{Namespace: ns, Name: name, Load: func(cm *corev1.ConfigMap) error {
			_, err := declaredHooks(declaredLoad(r.opts), r.opts.PolicyPaths, celpolicy.ConfigMapDocuments(cm))
			return err
		}}
	}
	return env
}

// start builds the hooks serve starts with. A declared set that does not
// load (or a policies ConfigMap that cannot be read: docsErr) does not stop
// the start: serve then runs the built-in policies, reports the
// declaredPolicies condition as degraded, and loads the declared set at
// the first change of its sources that builds. Exiting instead would take
// every kadmit webhook down with the replica, on every restart, until
// someone repairs the set.
func (r *reloader) start(ctx context.Context, docsErr error) ([]admission.Hook, error) {
	hooks, err := r.build(ctx, r.cfg, r.wantDocs, docsErr == nil)
	var de *served.DeclaredError
	if errors.As(err, &de) {
		docsErr = err
		hooks, err = r.build(ctx, r.cfg, nil, false)
	}
	if err != nil {
		return nil, err
	}
	if docsErr != nil {
		r.setUnserved(docsErr)
		r.log.Error("declared policies not served; serving the built-in policies until the declared set loads",
			"policies", r.opts.PolicyPaths, "policiesConfigMap", r.opts.PolicyConfigMap, "error", docsErr)
		return hooks, nil
	}
	r.policyDocs = r.wantDocs
	return hooks, nil
}

// setUnserved records why the declared policies are not served (nil: they
// are) for /readyz and the metric.
func (r *reloader) setUnserved(err error) {
	if err == nil {
		r.unserved.Store(nil)
	} else {
		r.unserved.Store(&err)
	}
	r.declaredMetric.Served(err == nil)
}

// declaredReady is the declaredPolicies readiness condition (Degraded):
// nil unless serve started with a declared set that does not load and has
// not loaded one since.
func (r *reloader) declaredReady() error {
	if p := r.unserved.Load(); p != nil {
		// /readyz is unauthenticated (the kubelet probes it): it carries
		// the start of the error, the log the whole.
		msg := (*p).Error()
		if len(msg) > maxReadyzReason {
			msg = fmt.Sprintf("%s…[%d bytes cut]", strings.ToValidUTF8(msg[:maxReadyzReason], ""), len(msg)-maxReadyzReason)
		}
		return fmt.Errorf("declared policies not served (only the built-in policies are): %s", msg)
	}
	return nil
}

// maxReadyzReason bounds the load error /readyz repeats, in bytes.
const maxReadyzReason = 1024

// reload applies a new valid configuration from the ConfigMap.
func (r *reloader) reload(cfg *config.Configuration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if reflect.DeepEqual(cfg, r.wantCfg) {
		return
	}
	r.wantCfg = cfg
	r.apply("configuration", "configMap", r.opts.ConfigMap)
}

// apply builds the wanted configuration and documents with the --policies
// files as they are now and, when they build, swaps them in; otherwise it
// logs why, keeps the running hooks and leaves the wanted versions to be
// retried at the next change of any source. Two cases still apply part of
// the change: while no declared set is served, a configuration is applied
// to the built-in policies alone; and a configuration that fails on its
// own does not hold back a declared change, which is applied with the
// running configuration. The caller holds r.mu.
func (r *reloader) apply(what string, attrs ...any) {
	webhooks, err := r.swap(r.wantCfg, r.wantDocs, true)
	if err == nil {
		r.cfg, r.policyDocs = r.wantCfg, r.wantDocs
		if r.declared() {
			r.setUnserved(nil)
		}
		r.metrics.Reloaded(true)
		r.log.Info(what+" reloaded", append(attrs, "paths", paths(webhooks))...)
		return
	}
	r.metrics.Reloaded(false)
	r.log.Error(what+" not applied; keeping the running configuration and policies", append(attrs, "error", err)...)
	var de *served.DeclaredError
	pendingCfg := !reflect.DeepEqual(r.wantCfg, r.cfg)
	switch {
	case errors.As(err, &de) && pendingCfg && r.unserved.Load() != nil:
		webhooks, err = r.swap(r.wantCfg, nil, false)
		if err == nil {
			r.cfg = r.wantCfg
		}
		r.partial("configuration applied to the built-in policies; the declared policies are still not served", webhooks, err)
	case !errors.As(err, &de) && pendingCfg && r.declared() && what != "configuration":
		webhooks, err = r.swap(r.cfg, r.wantDocs, true)
		if err == nil {
			r.policyDocs = r.wantDocs
			r.setUnserved(nil)
		}
		r.partial("declared policies applied with the running configuration; the new configuration is retried at the next change", webhooks, err)
	}
}

// partial records the outcome of applying part of a refused change.
func (r *reloader) partial(msg string, webhooks []*admission.Webhook, err error) {
	r.metrics.Reloaded(err == nil)
	if err != nil {
		r.log.Error(msg+": not applied either", "error", err)
		return
	}
	r.log.Info(msg, "paths", paths(webhooks))
}

// swap builds the hooks of cfg and docs and, when they build, puts them in
// the server and the registration at once; on an error nothing changes.
// The caller holds r.mu.
func (r *reloader) swap(cfg *config.Configuration, docs []celpolicy.Document, withDeclared bool) ([]*admission.Webhook, error) {
	hooks, err := r.build(r.ctx, cfg, docs, withDeclared)
	if err != nil {
		return nil, err
	}
	webhooks, err := admission.NewWebhooks(hooks)
	if err != nil {
		return nil, err
	}
	r.serve(webhooks)
	if r.register != nil {
		r.register(hooks)
	}
	return webhooks, nil
}

// rebuild rebuilds the hooks after the declared policy files (--policies)
// changed: the new policies are swapped in as a ConfigMap edit is, and an
// invalid edit is refused, keeping the running ones.
func (r *reloader) rebuild() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.apply("declared policies", "policies", r.opts.PolicyPaths)
}

// policyConfigMap applies an add, edit or deletion (cm nil) of
// --policies-configmap: a change of its data that builds (with the
// --policies files and the configuration) is swapped in; one that does not
// is refused and logged, and so is a deletion, keeping the running
// policies (an edit or a deletion by mistake never takes policies away; an
// empty ConfigMap serves none).
func (r *reloader) policyConfigMap(cm *corev1.ConfigMap) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cm == nil {
		r.metrics.Reloaded(false)
		r.log.Error("declared policies ConfigMap deleted; keeping the running policies", "policiesConfigMap", r.opts.PolicyConfigMap)
		return
	}
	docs := celpolicy.ConfigMapDocuments(cm)
	if r.haveDocs && slices.Equal(docs, r.wantDocs) {
		return
	}
	r.wantDocs, r.haveDocs = docs, true
	r.apply("declared policies", "policiesConfigMap", r.opts.PolicyConfigMap, "resourceVersion", cm.ResourceVersion)
}

// invalid reports a ConfigMap edit that does not validate.
func (r *reloader) invalid(err error) {
	r.metrics.Reloaded(false)
	r.log.Error("configuration not applied; keeping the running one", "configMap", r.opts.ConfigMap, "error", err)
}

func paths(webhooks []*admission.Webhook) []string {
	out := make([]string, 0, len(webhooks))
	for _, wh := range webhooks {
		out = append(out, wh.Path)
	}
	return out
}
