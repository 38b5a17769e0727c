// Package config loads and validates kadmit's configuration file: which
// policies are enabled and their parameters. It knows no policy by name: the
// sections come from a policy.Registry (package builtin lists kadmit's).
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/kadmit/kadmit/internal/policy"
)

// The accepted apiVersion and kind of a configuration file.
const (
	APIVersion = "kadmit.io/v1alpha1"
	Kind       = "Configuration"
)

// ErrInvalid is wrapped by every error about the content of a configuration.
var ErrInvalid = errors.New("invalid kadmit configuration")

// Configuration is kadmit's configuration file.
//
//	apiVersion: kadmit.io/v1alpha1
//	kind: Configuration
//	policies:
//	  podName: {enabled: true, words: [offensive]}
//	  lifespan: {enabled: true, max: 14}
//	  nodeOvercommit: {enabled: true, ratios: {cpu: "2"}, maxRatio: "4"}
//
// A policy section that is absent keeps its seed defaults; in a section that
// is present, each field present replaces its default whole (a map such as
// ratios is not merged key by key) and absent fields keep their defaults.
// Every section accepts `enabled` and `failurePolicy` (Fail or Ignore, in
// place of each of the policy's hooks' default).
type Configuration struct {
	APIVersion string
	Kind       string
	// Policies has one section per registered policy, in registry order.
	Policies []policy.Section
}

// Section returns the section of the policy with key, e.g. "lifespan".
func (c *Configuration) Section(key string) (policy.Section, bool) {
	for _, s := range c.Policies {
		if s.Entry().Key() == key {
			return s, true
		}
	}
	return nil, false
}

// Loader parses configurations for one registry of policies.
type Loader struct {
	Registry policy.Registry
}

// Default returns the seed profile: every registered policy with its
// defaults, enabled when its definition says so (pod-name, lifespan and
// node-overcommit in kadmit's registry).
func (l Loader) Default() *Configuration {
	c := &Configuration{APIVersion: APIVersion, Kind: Kind}
	for _, k := range l.Registry {
		c.Policies = append(c.Policies, k.Default())
	}
	return c
}

// LoadFile reads and parses path with Parse; errors name the file.
func (l Loader) LoadFile(path string) (*Configuration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, err := l.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// FromConfigMap parses data[key] of cm with Parse. Errors are prefixed
// "ConfigMap <namespace>/<name> data[<key>]: ", as LoadFile prefixes the
// file name, so the kadmit-config webhook's denial and a server that loads
// the same text print the same error.
func (l Loader) FromConfigMap(cm *corev1.ConfigMap, key string) (*Configuration, error) {
	where := fmt.Sprintf("ConfigMap %s/%s data[%s]", cm.Namespace, cm.Name, key)
	data, ok := cm.Data[key]
	if !ok {
		return nil, fmt.Errorf("%s: %w: the key is missing", where, ErrInvalid)
	}
	c, err := l.Parse([]byte(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	return c, nil
}

// envelope is the file's top level; sections stay raw until their policy
// decodes them.
type envelope struct {
	APIVersion string                     `json:"apiVersion"`
	Kind       string                     `json:"kind"`
	Policies   map[string]json.RawMessage `json:"policies"`
}

// Parse decodes YAML or JSON strictly (unknown or duplicate fields are
// errors, and field names are case-sensitive as in Kubernetes objects) over
// the seed defaults and validates the result. apiVersion and kind must be
// present. Errors wrap ErrInvalid and name the field, e.g.
// "policies.lifespan.max: must be >= 0".
func (l Loader) Parse(data []byte) (*Configuration, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%w: the file is empty", ErrInvalid)
	}
	// YAMLToJSONStrict refuses duplicate keys; JSON is valid YAML.
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var env envelope
	// sigs.k8s.io/json matches field names case-sensitively, unlike
	// encoding/json, so "Policies" is an unknown field, not policies.
	strictErrs, err := kjson.UnmarshalStrict(js, &env, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if len(strictErrs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, strictErrs[0])
	}
	c := &Configuration{APIVersion: env.APIVersion, Kind: env.Kind}
	if err := c.validateEnvelope(); err != nil {
		return nil, err
	}
	for key := range env.Policies {
		if _, ok := l.Registry.Lookup(key); !ok {
			return nil, fmt.Errorf("%w: policies.%s: unknown policy (known: %s)", ErrInvalid, key, l.keys())
		}
	}
	for _, k := range l.Registry {
		raw, ok := env.Policies[k.Key()]
		if !ok {
			c.Policies = append(c.Policies, k.Default())
			continue
		}
		s, err := k.Decode(raw)
		var de *policy.DecodeError
		switch {
		case errors.As(err, &de):
			return nil, fmt.Errorf("%w: policies.%s: %w", ErrInvalid, k.Key(), err)
		case err != nil:
			// Validation errors start with the field: "max: must be >= 0".
			return nil, fmt.Errorf("%w: policies.%s.%w", ErrInvalid, k.Key(), err)
		}
		c.Policies = append(c.Policies, s)
	}
	return c, nil
}

func (l Loader) keys() string {
	var b bytes.Buffer
	for i, k := range l.Registry {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k.Key())
	}
	return b.String()
}

func (c *Configuration) validateEnvelope() error {
	if c.APIVersion != APIVersion {
		return fmt.Errorf("%w: apiVersion: must be %s, got %q", ErrInvalid, APIVersion, c.APIVersion)
	}
	if c.Kind != Kind {
		return fmt.Errorf("%w: kind: must be %s, got %q", ErrInvalid, Kind, c.Kind)
	}
	return nil
}
