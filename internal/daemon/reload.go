package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/config"
	"github.com/kadmit/kadmit/internal/metrics"
	"github.com/kadmit/kadmit/internal/policy"
	"github.com/kadmit/kadmit/internal/policy/builtin"
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
type reloader struct {
	// ctx is serve's: cluster caches and reloads end with it.
	ctx context.Context
	// kube returns serve's one client configuration (loaded once).
	kube    func() (*rest.Config, error)
	opts    Options
	log     *slog.Logger
	metrics *metrics.ConfigReloads
	// serve and register apply new hooks; set once the server and the
	// registration exist.
	serve    func([]*admission.Webhook)
	register func([]admission.Hook)

	mu  sync.Mutex
	cfg *config.Configuration
	// policyDocs are the running documents of --policies-configmap: the
	// last edit that built.
	policyDocs  []celpolicy.Document
	cluster     *clustercache.Caches
	clusterKey  string
	stopCluster context.CancelFunc
}

// declared reports whether serve runs declared policies (--policies or
// --policies-configmap).
func (r *reloader) declared() bool {
	return len(r.opts.PolicyPaths) > 0 || r.opts.PolicyConfigMap != ""
}

// build returns the hooks of cfg and of the declared policies (the
// --policies files, read now, and docs), starting the cluster caches cfg needs (and
// waiting for them to sync) when they differ from the running ones.
func (r *reloader) build(ctx context.Context, cfg *config.Configuration, docs []celpolicy.Document) ([]admission.Hook, error) {
	cluster, stop := r.cluster, context.CancelFunc(nil)
	resources := builtin.Caches(cfg)
	if r.declared() {
		// Declared policies' namespaceSelector and namespaceObject read
		// namespaces, as the API server's plugins do from its informer.
		// namespaceObject is the whole namespace: kept whole.
		resources = append(resources, clustercache.Namespaces.Whole())
	}
	key := clustercache.Key(resources)
	if key != r.clusterKey {
		cluster = nil
		if len(resources) > 0 {
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
		}
	}
	hooks, err := builtin.Hooks(cfg, policy.Env{Cluster: cluster, Log: r.log})
	if err == nil && r.declared() {
		var declared []admission.Hook
		if declared, err = declaredHooks(r.opts.PolicyPaths, docs, cluster); err == nil {
			hooks = append(hooks, declared...)
		}
	}
	if err != nil {
		if stop != nil {
			stop()
		}
		return nil, err
	}
	if key != r.clusterKey {
		if r.stopCluster != nil {
			r.stopCluster()
		}
		r.cluster, r.clusterKey, r.stopCluster = cluster, key, stop
	}
	return hooks, nil
}

// reload applies a new valid configuration from the ConfigMap.
func (r *reloader) reload(cfg *config.Configuration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if reflect.DeepEqual(cfg, r.cfg) {
		return
	}
	webhooks, err := r.swap(cfg, r.policyDocs)
	if err != nil {
		r.metrics.Reloaded(false)
		r.log.Error("configuration not applied; keeping the running one", "configMap", r.opts.ConfigMap, "error", err)
		return
	}
	r.cfg = cfg
	r.metrics.Reloaded(true)
	r.log.Info("configuration reloaded", "configMap", r.opts.ConfigMap, "paths", paths(webhooks))
}

// swap builds the hooks of cfg and docs and, when they build, puts them in
// the server and the registration at once; on an error nothing changes.
// The caller holds r.mu.
func (r *reloader) swap(cfg *config.Configuration, docs []celpolicy.Document) ([]*admission.Webhook, error) {
	hooks, err := r.build(r.ctx, cfg, docs)
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

// rebuild rebuilds the running configuration's hooks after the declared
// policy files (--policies) changed: the new policies are swapped in as a
// ConfigMap edit is, and an invalid edit is refused, keeping the running
// ones.
func (r *reloader) rebuild() {
	r.mu.Lock()
	defer r.mu.Unlock()
	webhooks, err := r.swap(r.cfg, r.policyDocs)
	if err != nil {
		r.metrics.Reloaded(false)
		r.log.Error("declared policies not applied; keeping the running ones", "policies", r.opts.PolicyPaths, "error", err)
		return
	}
	r.metrics.Reloaded(true)
	r.log.Info("declared policies reloaded", "policies", r.opts.PolicyPaths, "paths", paths(webhooks))
}

// policyConfigMap applies an add, edit or deletion (cm nil) of
// --policies-configmap: a change of its data that builds (with the
// --policies files and the running configuration) is swapped in; one that
// does not is refused and logged, and so is a deletion, keeping the
// running policies (an edit or a deletion by mistake never takes policies
// away; an empty ConfigMap serves none).
func (r *reloader) policyConfigMap(cm *corev1.ConfigMap) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cm == nil {
		r.metrics.Reloaded(false)
		r.log.Error("declared policies ConfigMap deleted; keeping the running policies", "policiesConfigMap", r.opts.PolicyConfigMap)
		return
	}
	docs := celpolicy.ConfigMapDocuments(cm)
	if slices.Equal(docs, r.policyDocs) {
		return
	}
	webhooks, err := r.swap(r.cfg, docs)
	if err != nil {
		r.metrics.Reloaded(false)
		r.log.Error("declared policies not applied; keeping the running ones", "policiesConfigMap", r.opts.PolicyConfigMap, "resourceVersion", cm.ResourceVersion, "error", err)
		return
	}
	r.policyDocs = docs
	r.metrics.Reloaded(true)
	r.log.Info("declared policies reloaded", "policiesConfigMap", r.opts.PolicyConfigMap, "resourceVersion", cm.ResourceVersion, "paths", paths(webhooks))
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
