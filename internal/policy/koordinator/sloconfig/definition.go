package sloconfig

import (
	"context"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/policy"
)

// NodesCache is the node cache the ConfigMap's conflict check lists, as
// slo_config_plugin.go:89 does.
var NodesCache = clustercache.Resource{GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "nodes"}}

// ConfigMapsCache is the ConfigMap cache the node check reads
// slo-controller-config from (slo_plugin.go:75), limited to the
// ConfigMap's namespace: koord-manager caches every ConfigMap in the
// cluster, kadmit needs only a namespaced Role to list and watch them.
func ConfigMapsCache(namespace string) clustercache.Resource {
	return clustercache.Resource{GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Namespace: namespace}
}

// Definition is the slo-config policy's entry in builtin.Registry: section
// policies.sloConfig, off in the seed profile.
var Definition = &policy.Definition[Config]{
	PolicyName: Name,
	SectionKey: "sloConfig",
	Defaults:   DefaultConfig,
	// Of a node the checks read its labels (informerNodes); of a
	// ConfigMap its data (informerConfigMaps).
	Caches: func(cfg Config) []clustercache.Read {
		nodes := NodesCache.Keep(clustercache.P("metadata", "labels"))
		if cfg.NodeCheck {
			return []clustercache.Read{nodes, ConfigMapsCache(cfg.Namespace).Keep(clustercache.P("data"))}
		}
		return []clustercache.Read{nodes}
	},
	Build: func(cfg Config, env policy.Env) ([]admission.Hook, error) {
		var nodes Nodes
		var cms ConfigMaps
		if inf, ok := env.Cluster.Informer(NodesCache); ok {
			nodes = informerNodes{inf.GetIndexer()}
		}
		if cfg.NodeCheck {
			if inf, ok := env.Cluster.Informer(ConfigMapsCache(cfg.Namespace)); ok {
				cms = informerConfigMaps{inf.GetIndexer()}
			}
		}
		p, err := New(cfg, nodes, cms)
		if err != nil {
			return nil, err
		}
		return p.Hooks(), nil
	},
}

// informerNodes implements Nodes over a node informer's store.
type informerNodes struct{ store cache.Store }

// ctxCheckEvery is how many nodes are checked between looks at ctx.
const ctxCheckEvery = 256

func (n informerNodes) NodeLabels(ctx context.Context, f func(string, map[string]string) error) error {
	var nodes []*corev1.Node
	for _, o := range n.store.List() {
		if node, ok := o.(*corev1.Node); ok {
			nodes = append(nodes, node)
		}
	}
	slices.SortFunc(nodes, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	for i, node := range nodes {
		if i%ctxCheckEvery == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if err := f(node.Name, node.Labels); err != nil {
			return err
		}
	}
	return nil
}

// informerConfigMaps implements ConfigMaps over a ConfigMap informer's store.
type informerConfigMaps struct{ store cache.Store }

func (c informerConfigMaps) Data(namespace, name string) (map[string]string, bool) {
	o, ok, err := c.store.GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil, false
	}
	cm, ok := o.(*corev1.ConfigMap)
	if !ok {
		return nil, false
	}
	return cm.Data, true
}
