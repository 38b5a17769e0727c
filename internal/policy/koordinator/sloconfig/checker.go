package sloconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/go-playground/locales/en"
	ut "github.com/go-playground/universal-translator"
	"github.com/go-playground/validator/v10"
	transen "github.com/go-playground/validator/v10/translations/en"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Bounds on what a ConfigMap controls. Upstream has none; each is far above
// a real slo-controller-config (a few kilobytes, a handful of node
// strategies with one or two labels each).
const (
	// MaxValueBytes bounds one data key's JSON text.
	MaxValueBytes = 256 << 10
	// MaxNodeStrategies bounds the node strategies (nodeStrategies or
	// nodeConfigs) of one key.
	MaxNodeStrategies = 64
	// MaxSelectorRequirements bounds matchLabels plus matchExpressions of
	// one node strategy's nodeSelector.
	MaxSelectorRequirements = 32
	// MaxSelectorValues bounds the values of one matchExpressions entry.
	MaxSelectorValues = 64
	// MaxVirtualNodes bounds, per key, the label sets the overlap check
	// builds from the selectors (upstream selector.go:27-65 builds the
	// product of every expression's value count per strategy, which grows
	// exponentially with the expressions).
	MaxVirtualNodes = 4096
)

// Reasons of upstream's JSON-formatted errors (pkg/webhook/cm/plugins/
// sloconfig/result.go:26-29, v1.8.0).
const (
	ReasonOverlap          = "NodeStrategiesOverlap"
	ReasonExistNodeConfict = "ExistNodeConfict"
	ReasonParseFail        = "ParseConfigFail"
	ReasonParamInvalid     = "ConfigParamInvalid"
)

// jsonError is upstream's err.JsonFormatError (pkg/webhook/util/err,
// v1.8.0): its text is the JSON of {reason, message} between "___" marks,
// which koord-manager's users and tools parse.
type jsonError struct {
	Reason  string `json:"reason,omitempty"`
	Message any    `json:"message,omitempty"`
}

func (e *jsonError) Error() string {
	b, err := json.Marshal(e)
	if err != nil {
		return err.Error()
	}
	return "___" + string(b) + "___"
}

// conflictMessage is upstream's ExsitNodeConflictMessage (result.go:32-36).
type conflictMessage struct {
	Config                 string   `json:"config,omitempty"`
	ConflictNodeStrategies []string `json:"strategies,omitempty"`
	ExampleNodes           []string `json:"exampleNodes,omitempty"`
}

func paramInvalid(err error) error {
	var je *jsonError
	if errors.As(err, &je) {
		return je
	}
	return &jsonError{Reason: ReasonParamInvalid, Message: err.Error()}
}

// validate is upstream's DefaultValidator (pkg/util/sloconfig/
// validator.go:36-69): go-playground's validator with its English
// translations, built once.
var validate = sync.OnceValues(func() (*validator.Validate, ut.Translator) {
	v := validator.New()
	locale := en.New()
	trans, _ := ut.New(locale, locale).GetTranslator("en")
	if err := transen.RegisterDefaultTranslations(v, trans); err != nil {
		return v, nil
	}
	return v, trans
})

// checkByValidator is CommonChecker.CheckByValidator (checker.go:77-86):
// the struct's `validate` tags, each failure translated and keyed by the
// field's namespace, as one ConfigParamInvalid error.
func checkByValidator(cfg any) error {
	v, trans := validate()
	err := v.Struct(cfg)
	var verrs validator.ValidationErrors
	if errors.As(err, &verrs) && trans != nil {
		if info := verrs.Translate(trans); len(info) > 0 {
			return &jsonError{Reason: ReasonParamInvalid, Message: info}
		}
		return nil
	}
	return err
}

// profile is one node strategy with its parsed selector.
type profile struct {
	NodeCfgProfile
	selector labels.Selector
}

// checker is one data key of the ConfigMap, parsed: upstream's
// ColocationConfigChecker, ResourceThresholdChecker, ResourceQOSChecker,
// SystemConfigChecker and CPUBurstChecker (the files named after them in
// pkg/webhook/cm/plugins/sloconfig, v1.8.0), which differ only in the type
// they decode and, for resource-qos-config, the network QoS check.
type checker struct {
	key      string
	cfg      any // *ColocationCfg, *ResourceThresholdCfg, ...
	profiles []profile
	// initErr is upstream's initStatus other than "Success": the key
	// did not parse or a nodeSelector is empty or invalid.
	initErr error
	// extra runs after the validator (resource-qos-config's network QoS).
	extra func() error
}

// kind describes how to decode one key.
type kind struct {
	key string
	// what names the config in parse errors, as upstream spells it.
	what   string
	decode func(data map[string]string, ns, name string) (any, []NodeCfgProfile, func() error, error)
}

// kinds lists the keys in upstream's order (checkers.go:40-48).
var kinds = []kind{
	{ColocationConfigKey, "colocation", decodeColocation},
	{ResourceThresholdConfigKey, "resourceThreshold", decodeThreshold},
	{ResourceQOSConfigKey, "ResourceQOS", decodeQOS},
	{SystemConfigKey, "System", decodeSystem},
	{CPUBurstConfigKey, "CpuBurst", decodeCPUBurst},
}

// parseKey decodes data[key] as upstream's initConfig does: encoding/json
// into a pointer to the config type, a failure becoming a ParseConfigFail
// error naming the ConfigMap.
func parseKey[T any](data map[string]string, key, what, ns, name string) (*T, error) {
	s := data[key]
	if len(s) > MaxValueBytes {
		return nil, paramInvalid(fmt.Errorf("%s config in configmap %s/%s is %d bytes, more than %d", what, ns, name, len(s), MaxValueBytes))
	}
	cfg := new(T)
	err := json.Unmarshal([]byte(s), &cfg)
	if err == nil && cfg == nil {
		// Upstream dereferences the nil config and panics (answered 500
		// by controller-runtime's recovery); kadmit says why.
		err = errors.New("the config must be a JSON object, got null")
	}
	if err != nil {
		msg := fmt.Sprintf("Failed to parse %s config in configmap %s/%s, err: %s", what, ns, name, err)
		return nil, &jsonError{Reason: ReasonParseFail, Message: msg}
	}
	return cfg, nil
}

// parseNodes is parseKey plus the selector profile of each of the config's
// node strategies, which every key's checker reads the same way.
func parseNodes[C, S any](data map[string]string, key, what, ns, name string, nodes func(*C) []S, profile func(*S) NodeCfgProfile) (*C, []NodeCfgProfile, error) {
	cfg, err := parseKey[C](data, key, what, ns, name)
	if err != nil {
		return nil, nil, err
	}
	var ps []NodeCfgProfile
	for _, n := range nodes(cfg) {
		ps = append(ps, profile(&n))
	}
	return cfg, ps, nil
}

func decodeColocation(data map[string]string, ns, name string) (any, []NodeCfgProfile, func() error, error) {
	cfg, ps, err := parseNodes(data, ColocationConfigKey, "colocation", ns, name,
		func(c *ColocationCfg) []NodeColocationCfg { return c.NodeConfigs },
		func(n *NodeColocationCfg) NodeCfgProfile { return n.NodeCfgProfile })
	return cfg, ps, nil, err
}

func decodeThreshold(data map[string]string, ns, name string) (any, []NodeCfgProfile, func() error, error) {
	cfg, ps, err := parseNodes(data, ResourceThresholdConfigKey, "resourceThreshold", ns, name,
		func(c *ResourceThresholdCfg) []NodeResourceThresholdStrategy { return c.NodeStrategies },
		func(n *NodeResourceThresholdStrategy) NodeCfgProfile { return n.NodeCfgProfile })
	return cfg, ps, nil, err
}

func decodeCPUBurst(data map[string]string, ns, name string) (any, []NodeCfgProfile, func() error, error) {
	cfg, ps, err := parseNodes(data, CPUBurstConfigKey, "CpuBurst", ns, name,
		func(c *CPUBurstCfg) []NodeCPUBurstCfg { return c.NodeStrategies },
		func(n *NodeCPUBurstCfg) NodeCfgProfile { return n.NodeCfgProfile })
	return cfg, ps, nil, err
}

func decodeSystem(data map[string]string, ns, name string) (any, []NodeCfgProfile, func() error, error) {
	cfg, ps, err := parseNodes(data, SystemConfigKey, "System", ns, name,
		func(c *SystemCfg) []NodeSystemStrategy { return c.NodeStrategies },
		func(n *NodeSystemStrategy) NodeCfgProfile { return n.NodeCfgProfile })
	return cfg, ps, nil, err
}

// decodeQOS also decodes system-config, whose totalNetworkBandwidth bounds
// the network QoS (resource_qos_checker.go:365-395): like upstream, a
// resource-qos-config without a parsable system-config fails.
func decodeQOS(data map[string]string, ns, name string) (any, []NodeCfgProfile, func() error, error) {
	cfg, ps, err := parseNodes(data, ResourceQOSConfigKey, "ResourceQOS", ns, name,
		func(c *ResourceQOSCfg) []NodeResourceQOSStrategy { return c.NodeStrategies },
		func(n *NodeResourceQOSStrategy) NodeCfgProfile { return n.NodeCfgProfile })
	if err != nil {
		return nil, nil, nil, err
	}
	sys, err := parseKey[SystemCfg](data, SystemConfigKey, "System", ns, name)
	if err != nil {
		return nil, nil, nil, err
	}
	return cfg, ps, func() error { return checkNetQOS(cfg, sys) }, nil
}

// newChecker parses data[k.key] and its node strategies' selectors
// (upstream's initConfig and CreateNodeConfigProfileChecker, checker.go:
// 98-123): a strategy without a selector, or with one
// metav1.LabelSelectorAsSelector refuses, fails the key.
func newChecker(k kind, data map[string]string, ns, name string) *checker {
	c := &checker{key: k.key}
	cfg, ps, extra, err := k.decode(data, ns, name)
	if err != nil {
		c.initErr = err
		return c
	}
	c.cfg, c.extra = cfg, extra
	if len(ps) > MaxNodeStrategies {
		c.initErr = paramInvalid(fmt.Errorf("configType: %s has %d node strategies, more than %d", k.key, len(ps), MaxNodeStrategies))
		return c
	}
	virtual := 0
	for _, p := range ps {
		sel := p.NodeSelector
		if sel == nil || (len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0) {
			c.initErr = paramInvalid(fmt.Errorf("nodeConfigs NodeSelector must not empty error! configType: %s,nodeConfig name:%s", k.key, p.Name))
			return c
		}
		if n := len(sel.MatchLabels) + len(sel.MatchExpressions); n > MaxSelectorRequirements {
			c.initErr = paramInvalid(fmt.Errorf("configType: %s,nodeConfig name:%s: nodeSelector has %d requirements, more than %d", k.key, p.Name, n, MaxSelectorRequirements))
			return c
		}
		count := 1
		for _, e := range sel.MatchExpressions {
			if len(e.Values) > MaxSelectorValues {
				c.initErr = paramInvalid(fmt.Errorf("configType: %s,nodeConfig name:%s: nodeSelector expression %q has %d values, more than %d", k.key, p.Name, e.Key, len(e.Values), MaxSelectorValues))
				return c
			}
			if len(e.Values) > 0 {
				count *= len(e.Values) // at most 64^32 before the check below stops it
				if count > MaxVirtualNodes {
					break
				}
			}
		}
		if virtual += count; count > MaxVirtualNodes || virtual > MaxVirtualNodes {
			c.initErr = paramInvalid(fmt.Errorf("configType: %s: the nodeSelectors' expressions combine into more than %d label sets for the overlap check; use fewer values per expression", k.key, MaxVirtualNodes))
			return c
		}
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			c.initErr = paramInvalid(fmt.Errorf("failed to parse node selector %v,configType: %s,nodeConfig name:%s, err: %s", sel, k.key, p.Name, err.Error()))
			return c
		}
		c.profiles = append(c.profiles, profile{NodeCfgProfile: p, selector: s})
	}
	return c
}

// checkContents is checkers.CheckConfigContents for one key
// (checkers.go:50-69): the validator's tags, the key's own check, the
// strategy names when nameCheck, then the selector overlap.
func (c *checker) checkContents(nameCheck bool) error {
	if c.initErr != nil {
		return c.initErr
	}
	if err := checkByValidator(c.cfg); err != nil {
		return err
	}
	if c.extra != nil {
		if err := c.extra(); err != nil {
			return err
		}
	}
	if nameCheck {
		if err := c.checkNames(); err != nil {
			return err
		}
	}
	return c.selectorOverlap()
}

// checkNames is nodeConfigProfileChecker.checkName (checker.go:136-149).
func (c *checker) checkNames() error {
	seen := map[string]bool{}
	for _, p := range c.profiles {
		if p.Name == "" {
			return paramInvalid(fmt.Errorf("nodeConfig Name need! configType:%s", c.key))
		}
		if seen[p.Name] {
			return paramInvalid(fmt.Errorf("nodeConfig Name confilict, configType:%s,nodeConfig Name:%s! ", c.key, p.Name))
		}
		seen[p.Name] = true
	}
	return nil
}

// selectorOverlap is NodeSelectorOverlap (checker.go:155-180): a label set
// built from each selector (virtualNodes) that two selectors match is an
// overlap.
func (c *checker) selectorOverlap() error {
	var nodes []labels.Set
	for _, p := range c.profiles {
		nodes = append(nodes, virtualNodes(p.NodeSelector)...)
	}
	for _, n := range nodes {
		if names := c.matching(n); len(names) > 1 {
			return &jsonError{Reason: ReasonOverlap, Message: &conflictMessage{Config: c.key, ConflictNodeStrategies: names}}
		}
	}
	return nil
}

func (c *checker) matching(l labels.Set) []string {
	var names []string
	for _, p := range c.profiles {
		if p.selector.Matches(l) {
			names = append(names, p.Name)
		}
	}
	return names
}

// nodeConflict is ExistNodeConflict (checker.go:186-205): with more than
// one node strategy, a node whose labels two of them match is a conflict.
func (c *checker) nodeConflict(nodeName string, nodeLabels map[string]string) error {
	if len(c.profiles) <= 1 {
		return nil
	}
	if names := c.matching(labels.Set(nodeLabels)); len(names) > 1 {
		return &jsonError{Reason: ReasonExistNodeConfict, Message: &conflictMessage{Config: c.key, ConflictNodeStrategies: names, ExampleNodes: []string{nodeName}}}
	}
	return nil
}

// virtualNodes is generateNodesByNodeSelector (selector.go:27-65): the
// product of the expressions' values, each label set also holding
// matchLabels. newChecker has bounded the product by MaxVirtualNodes.
func virtualNodes(sel *metav1.LabelSelector) []labels.Set {
	if sel == nil {
		return nil
	}
	n := 1
	for _, e := range sel.MatchExpressions {
		if len(e.Values) > 0 {
			n *= len(e.Values)
		}
	}
	out := make([]labels.Set, n)
	for i := range out {
		out[i] = labels.Set{}
	}
	// Upstream ranges over the matchLabels map; the result does not
	// depend on the order.
	for k, v := range sel.MatchLabels {
		for i := range out {
			out[i][k] = v
		}
	}
	for _, e := range sel.MatchExpressions {
		if len(e.Values) == 0 {
			continue
		}
		for i := range out {
			out[i][e.Key] = e.Values[i%len(e.Values)]
		}
	}
	return out
}

// changed reports upstream's IsCfgNotEmptyAndChanged (checker.go:57-71):
// the new value is not empty and differs from the old one (or there is no
// old ConfigMap).
func changed(key string, oldData map[string]string, hasOld bool, newData map[string]string) bool {
	v := newData[key]
	if v == "" {
		return false
	}
	return !hasOld || oldData[key] != v
}
