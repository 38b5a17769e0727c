package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kadmit/kadmit/internal/admission"
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

	mu          sync.Mutex
	cfg         *config.Configuration
	cluster     *clustercache.Caches
	clusterKey  string
	stopCluster context.CancelFunc
}

// build returns cfg's hooks, starting the cluster caches cfg needs (and
// waiting for them to sync) when they differ from the running ones.
func (r *reloader) build(ctx context.Context, cfg *config.Configuration) ([]admission.Hook, error) {
	cluster, stop := r.cluster, context.CancelFunc(nil)
	resources := builtin.Caches(cfg)
	if len(r.opts.PolicyPaths) > 0 {
		// Declared policies' namespaceSelector and namespaceObject read
		// namespaces, as the API server's plugins do from its informer.
		resources = append(resources, clustercache.Namespaces)
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
	if err == nil && len(r.opts.PolicyPaths) > 0 {
		var declared []admission.Hook
		if declared, err = declaredHooks(r.opts.PolicyPaths, cluster); err == nil {
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
	hooks, err := r.build(r.ctx, cfg)
	if err == nil {
		var webhooks []*admission.Webhook
		if webhooks, err = admission.NewWebhooks(hooks); err == nil {
			r.serve(webhooks)
			if r.register != nil {
				r.register(hooks)
			}
			r.cfg = cfg
			r.metrics.Reloaded(true)
			r.log.Info("configuration reloaded", "configMap", r.opts.ConfigMap, "paths", paths(webhooks))
			return
		}
	}
	r.metrics.Reloaded(false)
	r.log.Error("configuration not applied; keeping the running one", "configMap", r.opts.ConfigMap, "error", err)
}

// rebuild rebuilds the running configuration's hooks after the declared
// policy files (--policies) changed: the new policies are swapped in as a
// ConfigMap edit is, and an invalid edit is refused, keeping the running
// ones.
func (r *reloader) rebuild() {
	r.mu.Lock()
	defer r.mu.Unlock()
	hooks, err := r.build(r.ctx, r.cfg)
	if err == nil {
		var webhooks []*admission.Webhook
		if webhooks, err = admission.NewWebhooks(hooks); err == nil {
			r.serve(webhooks)
			if r.register != nil {
				r.register(hooks)
			}
			r.metrics.Reloaded(true)
			r.log.Info("declared policies reloaded", "policies", r.opts.PolicyPaths, "paths", paths(webhooks))
			return
		}
	}
	r.metrics.Reloaded(false)
	r.log.Error("declared policies not applied; keeping the running ones", "policies", r.opts.PolicyPaths, "error", err)
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
