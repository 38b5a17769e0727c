// Package kadmitconfig implements the kadmit-config policy: a validating
// hook on the ConfigMap that holds kadmit's own configuration, which refuses
// any version of it that kadmit itself would refuse to load. A bad config can
// then never be stored, so a restarting kadmit never finds one.
package kadmitconfig

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kadmit/kadmit/internal/admission"
)

// Name is the policy's name (policies.kadmitConfig in the configuration).
const Name = "kadmit-config"

// Path is the validating hook's path, as Koordinator names its own.
const Path = "/validate-configmap"

// DefaultKey is the ConfigMap data key holding the YAML configuration.
const DefaultKey = "config.yaml"

// Config is the kadmit-config policy's configuration (policies.kadmitConfig).
type Config struct {
	// Namespace and Name locate the ConfigMap; both required when enabled.
	// The namespace must be one kadmit's webhooks see: not kube-system, and
	// not kadmit's own --namespace, which its registration excludes.
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	// Key is the data key holding the configuration; default config.yaml.
	Key string `json:"key,omitempty"`
}

// DefaultConfig is the seed profile: disabled, key config.yaml.
func DefaultConfig() Config { return Config{Key: DefaultKey} }

// Validate reports the first problem as "<field>: <problem>".
func (c Config) Validate() error {
	if c.Namespace != "" || c.Name != "" {
		if err := c.ValidateEnabled(); err != nil {
			return err
		}
	}
	if errs := validation.IsConfigMapKey(c.Key); len(errs) > 0 {
		return fmt.Errorf("key: %q: %s", c.Key, errs[0])
	}
	return nil
}

// ValidateEnabled checks the fields an enabled policy needs: the
// ConfigMap's namespace and name (policy.EnabledValidator).
func (c Config) ValidateEnabled() error {
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

// LoadFunc loads kadmit's configuration from data[key] of cm exactly as
// `kadmit serve` does, returning the error serve would print.
type LoadFunc func(cm *corev1.ConfigMap, key string) error

// Policy is the kadmit-config policy.
type Policy struct {
	cfg  Config
	load LoadFunc
}

// New validates cfg and builds the policy around load (config.FromConfigMap
// in kadmit; the indirection keeps this package out of an import cycle with
// the config package, which embeds this Config).
func New(cfg Config, load LoadFunc) (*Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.ValidateEnabled(); err != nil {
		return nil, err
	}
	if load == nil {
		return nil, errors.New("no configuration loader")
	}
	return &Policy{cfg: cfg, load: load}, nil
}

// Hooks returns the validating hook: configmaps CREATE and UPDATE on
// /validate-configmap, failurePolicy Fail. Every ConfigMap write in the
// namespaces kadmit sees reaches it; all but the configured one are allowed
// after decoding only their metadata.
func (p *Policy) Hooks() []admission.Hook {
	fp := admissionregistrationv1.Fail
	return []admission.Hook{{
		Policy: Name, Path: Path, Type: admission.Validating,
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
		}},
		FailurePolicy: fp,
		// The ConfigMap usually lives in kadmit's own namespace, which every
		// other webhook excludes; this one watches that namespace alone.
		Namespaces: []string{p.cfg.Namespace},
		Validator:  admission.ValidatorFunc(p.Validate),
	}}
}

// Validate denies (403) the configured ConfigMap when its config does not
// load; the message is the loader's error, e.g. `ConfigMap kadmit/config
// data[config.yaml]: invalid kadmit configuration: policies.lifespan.max:
// must be >= 0`. Other ConfigMaps are allowed.
func (p *Policy) Validate(_ context.Context, req *admission.Request) admission.Verdict {
	ns := req.Namespace
	name := req.Name
	if ns != p.cfg.Namespace || (name != "" && name != p.cfg.Name) {
		return admission.Allow()
	}
	var cm corev1.ConfigMap
	if err := json.Unmarshal(req.Object.Raw, &cm); err != nil {
		return admission.Invalid("%s: cannot parse the ConfigMap: %v", Name, err)
	}
	if cm.Name != p.cfg.Name {
		return admission.Allow()
	}
	if cm.Namespace == "" {
		cm.Namespace = ns
	}
	if err := p.load(&cm, p.cfg.Key); err != nil {
		return admission.Deny("%v", err)
	}
	return admission.Allow()
}
