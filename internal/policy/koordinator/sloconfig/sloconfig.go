// Package sloconfig implements the slo-config policy: Koordinator's
// validation of its slo-controller-config ConfigMap on /validate-configmap
// (pkg/webhook/cm/, v1.8.0) and the node-label check that goes with it on
// /validate-node (pkg/webhook/node/plugins/sloconfig/slo_plugin.go).
//
// The ConfigMap carries one JSON strategy per data key (colocation-config,
// resource-threshold-config, resource-qos-config, system-config,
// cpu-burst-config), each a cluster strategy plus node strategies that
// select nodes by label. A write is refused when a changed key does not
// parse, breaks a field rule, or has two node strategies whose selectors
// overlap or that both match an existing node; a node label change is
// refused when it makes the node match two node strategies of one key.
package sloconfig

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
)

// Name is the policy's name (policies.sloConfig in the configuration).
const Name = "slo-config"

const (
	// ConfigMapPath is upstream's path for the ConfigMap hook
	// (pkg/webhook/cm/validating/webhooks.go:27).
	ConfigMapPath = "/validate-configmap"
	// NodePath is upstream's path for the node hook
	// (pkg/webhook/node/validating/webhooks.go:27).
	NodePath = "/validate-node"
)

// Upstream's defaults for the ConfigMap's location (pkg/util/sloconfig/
// config.go:25-38, flags --config-namespace and --slo-config-name).
const (
	DefaultNamespace = "koordinator-system"
	DefaultName      = "slo-controller-config"
)

// Config is the slo-config policy's configuration (policies.sloConfig).
type Config struct {
	// Namespace and Name locate the slo-controller-config ConfigMap, as
	// koord-manager's --config-namespace and --slo-config-name do.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// NodeStrategyNameCheck requires every node strategy to have a name,
	// unique within its key (koord-manager's
	// --node-strategy-name-need-check, default false).
	NodeStrategyNameCheck bool `json:"nodeStrategyNameCheck"`
	// NodeCheck serves /validate-node: a node label change that makes the
	// node match two node strategies of one key is refused (upstream
	// always serves it). It caches every ConfigMap of the cluster, as
	// koord-manager's client does.
	NodeCheck bool `json:"nodeCheck"`
}

// DefaultConfig is upstream's: koordinator-system/slo-controller-config,
// no name check, the node hook on.
func DefaultConfig() Config {
	return Config{Namespace: DefaultNamespace, Name: DefaultName, NodeCheck: true}
}

// Validate reports the first problem as "<field>: <problem>".
func (c Config) Validate() error {
	if errs := validation.IsDNS1123Label(c.Namespace); len(errs) > 0 {
		return fmt.Errorf("namespace: %q: %s", c.Namespace, errs[0])
	}
	if c.Namespace == "kube-system" {
		return errors.New("namespace: kube-system is excluded from kadmit's webhooks")
	}
	if errs := validation.IsDNS1123Subdomain(c.Name); len(errs) > 0 {
		return fmt.Errorf("name: %q: %s", c.Name, errs[0])
	}
	return nil
}

// Nodes lists the cluster's nodes for the conflict check; nil offline.
type Nodes interface {
	// NodeLabels calls f with each node's name and labels, in name order,
	// until f returns an error, which it returns.
	NodeLabels(ctx context.Context, f func(name string, labels map[string]string) error) error
}

// ConfigMaps reads the slo-controller-config ConfigMap from the cluster;
// nil offline.
type ConfigMaps interface {
	// Data returns the ConfigMap's data, or false when it does not exist.
	Data(namespace, name string) (map[string]string, bool)
}

// Policy is the slo-config policy.
type Policy struct {
	cfg        Config
	nodes      Nodes
	configMaps ConfigMaps
}

// New validates cfg; nodes and configMaps may be nil (offline).
func New(cfg Config, nodes Nodes, configMaps ConfigMaps) (*Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Policy{cfg: cfg, nodes: nodes, configMaps: configMaps}, nil
}

var (
	_ admission.Validator = admission.ValidatorFunc((*Policy)(nil).ValidateConfigMap)
	_ admission.Validator = admission.ValidatorFunc((*Policy)(nil).ValidateNode)
)

// Hooks returns the ConfigMap hook (configmaps CREATE, UPDATE, DELETE on
// /validate-configmap, failurePolicy Fail, limited to the configured
// namespace) and, with NodeCheck, the node hook (nodes CREATE, UPDATE on
// /validate-node, failurePolicy Ignore), as upstream registers them
// (webhooks.go of pkg/webhook/cm/validating:27 and
// pkg/webhook/node/validating:27). Other policies may share both paths:
// each hook judges only its own objects and allows the rest.
func (p *Policy) Hooks() []admission.Hook {
	rule := func(resource string, ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
		return []admissionregistrationv1.RuleWithOperations{{
			Operations: ops,
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{resource}},
		}}
	}
	hooks := []admission.Hook{{
		Policy: Name, Path: ConfigMapPath, Type: admission.Validating,
		Rules:         rule("configmaps", admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete),
		FailurePolicy: admissionregistrationv1.Fail,
		// Only the ConfigMap's namespace: koordinator-system is usually
		// also where koord-manager runs, and the webhook's
		// namespaceSelector then names it (with kadmit-config's namespace
		// when both share the path) instead of excluding it.
		Namespaces: []string{p.cfg.Namespace},
		Validator:  admission.ValidatorFunc(p.ValidateConfigMap),
	}}
	if p.cfg.NodeCheck {
		hooks = append(hooks, admission.Hook{
			Policy: Name, Path: NodePath, Type: admission.Validating,
			Rules:         rule("nodes", admissionregistrationv1.Create, admissionregistrationv1.Update),
			FailurePolicy: admissionregistrationv1.Ignore,
			Validator:     admission.ValidatorFunc(p.ValidateNode),
		})
	}
	return hooks
}

// configMap is the part of a ConfigMap the policy reads.
type configMap struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Data map[string]string `json:"data"`
}

// ValidateConfigMap is upstream's ConfigMapValidatingHandler.Handle with the
// SLOConfig plugin (validating_handler.go:67-116, slo_config_plugin.go:
// 57-98): only configmaps (no subresource) named Namespace/Name; DELETE is
// allowed; on CREATE every non-empty key, on UPDATE every non-empty key
// whose text changed, is parsed and checked in upstream's key order; then,
// when a checked key has two or more node strategies, every node of the
// cluster is checked for matching two of them. Denials are 400 with
// upstream's message, e.g. `___{"reason":"ConfigParamInvalid","message":
// {"ResourceThresholdCfg.ClusterStrategy.CPUSuppressThresholdPercent":
// "CPUSuppressThresholdPercent must be 100 or less"}}___`.
func (p *Policy) ValidateConfigMap(ctx context.Context, req *admission.Request) admission.Verdict {
	if req.SubResource != "" || req.Resource.Resource != "configmaps" {
		return admission.Allow()
	}
	// The request names the object; the decoded object decides, as
	// upstream compares the decoded ConfigMap's namespace and name.
	if req.Namespace != p.cfg.Namespace || (req.Name != "" && req.Name != p.cfg.Name) {
		return admission.Allow()
	}
	if req.Operation == admissionv1.Delete || (req.Operation != admissionv1.Create && req.Operation != admissionv1.Update) {
		// slo_config_plugin.go:69-71: a deletion is only logged.
		return admission.Allow()
	}
	var cm configMap
	if err := jsonedit.Unmarshal(req.Object.Raw, &cm); err != nil {
		return admission.Invalid("%s: cannot parse the ConfigMap: %v", Name, err)
	}
	if cm.Metadata.Namespace == "" {
		cm.Metadata.Namespace = req.Namespace
	}
	if cm.Metadata.Namespace != p.cfg.Namespace || cm.Metadata.Name != p.cfg.Name {
		return admission.Allow()
	}
	var old configMap
	hasOld := req.Operation == admissionv1.Update
	if hasOld {
		if err := jsonedit.Unmarshal(req.OldObject.Raw, &old); err != nil {
			return admission.Invalid("%s: cannot parse the old ConfigMap: %v", Name, err)
		}
	}
	checkers := p.changedCheckers(old.Data, hasOld, cm)
	for _, c := range checkers {
		if err := c.checkContents(p.cfg.NodeStrategyNameCheck); err != nil {
			return admission.Invalid("%s", err.Error())
		}
	}
	if !slices.ContainsFunc(checkers, func(c *checker) bool { return len(c.profiles) > 1 }) {
		return admission.Allow()
	}
	if p.nodes == nil {
		return admission.Allow(fmt.Sprintf("%s: node conflicts not checked offline", Name))
	}
	err := p.nodes.NodeLabels(ctx, func(name string, l map[string]string) error {
		for _, c := range checkers {
			if err := c.nodeConflict(name, l); err != nil {
				return err
			}
		}
		return nil
	})
	var je *jsonError
	switch {
	case errors.As(err, &je):
		return admission.Invalid("%s", je.Error())
	case ctx.Err() != nil:
		// The request's deadline passed mid-check: no decision was made.
		return admission.Errored(0, fmt.Errorf("%s: node conflict check: %w", Name, err))
	case err != nil:
		// slo_config_plugin.go:89-91: listing the nodes failed.
		return admission.Invalid("check config conflict fail! list node fail,error:%v", err)
	}
	return admission.Allow()
}

// changedCheckers is CreateCheckersChanged (checkers.go:27-38).
func (p *Policy) changedCheckers(oldData map[string]string, hasOld bool, cm configMap) []*checker {
	var out []*checker
	for _, k := range kinds {
		if changed(k.key, oldData, hasOld, cm.Data) {
			out = append(out, newChecker(k, cm.Data, cm.Metadata.Namespace, cm.Metadata.Name))
		}
	}
	return out
}

// ValidateNode is upstream's NodeValidatingHandler with the
// SLOManagerConfigConflictForNode plugin (pkg/webhook/node/validating/
// validating_handler.go:65-114, plugins/sloconfig/slo_plugin.go:56-106):
// on UPDATE of a node (no subresource) whose labels changed, every key of
// the stored slo-controller-config that parses (CreateCheckersAll with
// needUnmarshal) is asked whether the node now matches two of its node
// strategies; if so, 400 ExistNodeConfict. CREATE is only checked for the
// log upstream and always allowed; a missing ConfigMap allows.
func (p *Policy) ValidateNode(ctx context.Context, req *admission.Request) admission.Verdict {
	if req.SubResource != "" || req.Resource.Resource != "nodes" || req.Operation != admissionv1.Update {
		return admission.Allow()
	}
	newLabels, name, err := nodeLabels(req.Object.Raw)
	if err != nil {
		return admission.Invalid("%s: cannot parse the node: %v", Name, err)
	}
	oldLabels, _, err := nodeLabels(req.OldObject.Raw)
	if err != nil {
		return admission.Invalid("%s: cannot parse the old node: %v", Name, err)
	}
	// slo_plugin.go:101-106: reflect.DeepEqual of the two label maps, so
	// absent (nil) and {} differ, as there.
	if reflect.DeepEqual(newLabels, oldLabels) {
		return admission.Allow()
	}
	if p.configMaps == nil {
		return admission.Allow(fmt.Sprintf("%s: node not checked against %s/%s offline", Name, p.cfg.Namespace, p.cfg.Name))
	}
	data, ok := p.configMaps.Data(p.cfg.Namespace, p.cfg.Name)
	if !ok {
		return admission.Allow()
	}
	for _, k := range kinds {
		if err := ctx.Err(); err != nil {
			return admission.Errored(0, fmt.Errorf("%s: %w", Name, err))
		}
		c := newChecker(k, data, p.cfg.Namespace, p.cfg.Name)
		if c.initErr != nil {
			continue
		}
		if err := c.nodeConflict(name, newLabels); err != nil {
			return admission.Invalid("%s", err.Error())
		}
	}
	return admission.Allow()
}

func nodeLabels(raw []byte) (map[string]string, string, error) {
	doc := jsonedit.NewDoc(raw)
	var l map[string]string
	if _, err := doc.Decode(&l, "metadata", "labels"); err != nil {
		return nil, "", err
	}
	var name string
	if _, err := doc.Decode(&name, "metadata", "name"); err != nil {
		return nil, "", err
	}
	return l, name, nil
}
