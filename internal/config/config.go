// Package config loads and validates kadmit's configuration file: which
// policies are enabled and their parameters.
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

	"github.com/kadmit/kadmit/internal/policy/colocation"
	"github.com/kadmit/kadmit/internal/policy/elasticquota"
	"github.com/kadmit/kadmit/internal/policy/jobqueue"
	"github.com/kadmit/kadmit/internal/policy/kadmitconfig"
	"github.com/kadmit/kadmit/internal/policy/lifespan"
	"github.com/kadmit/kadmit/internal/policy/nodeovercommit"
	"github.com/kadmit/kadmit/internal/policy/podname"
	"github.com/kadmit/kadmit/internal/policy/resourceflavor"
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
// A policy section that is absent keeps its seed defaults; a section that is
// present overrides the defaults field by field, and a map field (ratios) is
// replaced whole.
type Configuration struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Policies   Policies `json:"policies"`
}

// Policies holds each built-in policy's configuration.
type Policies struct {
	PodName        podname.Config        `json:"podName"`
	Lifespan       lifespan.Config       `json:"lifespan"`
	NodeOvercommit nodeovercommit.Config `json:"nodeOvercommit"`
	// The scheduling-system policies; disabled in the seed profile.
	JobQueue       jobqueue.Config       `json:"jobQueue"`
	ResourceFlavor resourceflavor.Config `json:"resourceFlavor"`
	ElasticQuota   elasticquota.Config   `json:"elasticQuota"`
	Colocation     colocation.Config     `json:"colocation"`
	KadmitConfig   kadmitconfig.Config   `json:"kadmitConfig"`
}

// Default returns the seed profile: pod-name, lifespan and node-overcommit
// enabled with their documented defaults; the scheduling-system policies
// (jobQueue, resourceFlavor, elasticQuota, colocation, kadmitConfig) present
// with their defaults but disabled.
func Default() *Configuration {
	return &Configuration{
		APIVersion: APIVersion,
		Kind:       Kind,
		Policies: Policies{
			PodName:        podname.DefaultConfig(),
			Lifespan:       lifespan.DefaultConfig(),
			NodeOvercommit: nodeovercommit.DefaultConfig(),
			JobQueue:       jobqueue.DefaultConfig(),
			ResourceFlavor: resourceflavor.DefaultConfig(),
			ElasticQuota:   elasticquota.DefaultConfig(),
			Colocation:     colocation.DefaultConfig(),
			KadmitConfig:   kadmitconfig.DefaultConfig(),
		},
	}
}

// LoadFile reads and parses path with Parse; errors name the file.
func LoadFile(path string) (*Configuration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// FromConfigMap parses data[key] of cm with Parse. Errors are prefixed
// "ConfigMap <namespace>/<name> data[<key>]: ", as LoadFile prefixes the
// file name, so the kadmit-config webhook's denial and a server that loads
// the same text print the same error.
func FromConfigMap(cm *corev1.ConfigMap, key string) (*Configuration, error) {
	where := fmt.Sprintf("ConfigMap %s/%s data[%s]", cm.Namespace, cm.Name, key)
	data, ok := cm.Data[key]
	if !ok {
		return nil, fmt.Errorf("%s: %w: the key is missing", where, ErrInvalid)
	}
	c, err := Parse([]byte(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	return c, nil
}

// Parse decodes YAML or JSON strictly (unknown or duplicate fields are
// errors, and field names are case-sensitive as in Kubernetes objects) over
// the seed defaults and validates the result. apiVersion and kind must be
// present. Errors wrap ErrInvalid and name the field, e.g.
// "policies.lifespan.max: must be >= 0".
func Parse(data []byte) (*Configuration, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%w: the file is empty", ErrInvalid)
	}
	// YAMLToJSONStrict refuses duplicate keys; JSON is valid YAML.
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	c := Default()
	// The envelope has no default: a file must say what it is.
	c.APIVersion, c.Kind = "", ""
	// Replace maps whole instead of merging keys into the defaults, so a
	// file that lists only memory does not silently keep the cpu default.
	var probe struct {
		Policies struct {
			NodeOvercommit map[string]json.RawMessage `json:"nodeOvercommit"`
		} `json:"policies"`
	}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(js, &probe); err == nil {
		if _, ok := probe.Policies.NodeOvercommit["ratios"]; ok {
			c.Policies.NodeOvercommit.Ratios = nil
		}
	}
	// sigs.k8s.io/json matches field names case-sensitively, unlike
	// encoding/json, so "podname" is an unknown field, not podName.
	strictErrs, err := kjson.UnmarshalStrict(js, c, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if len(strictErrs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, strictErrs[0])
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Validate checks the envelope and every policy section; the error wraps
// ErrInvalid and names the first bad field.
func (c *Configuration) Validate() error {
	if c.APIVersion != APIVersion {
		return fmt.Errorf("%w: apiVersion: must be %s, got %q", ErrInvalid, APIVersion, c.APIVersion)
	}
	if c.Kind != Kind {
		return fmt.Errorf("%w: kind: must be %s, got %q", ErrInvalid, Kind, c.Kind)
	}
	for _, p := range []struct {
		field string
		err   error
	}{
		{"podName", c.Policies.PodName.Validate()},
		{"lifespan", c.Policies.Lifespan.Validate()},
		{"nodeOvercommit", c.Policies.NodeOvercommit.Validate()},
		{"jobQueue", c.Policies.JobQueue.Validate()},
		{"resourceFlavor", c.Policies.ResourceFlavor.Validate()},
		{"elasticQuota", c.Policies.ElasticQuota.Validate()},
		{"colocation", c.Policies.Colocation.Validate()},
		{"kadmitConfig", c.Policies.KadmitConfig.Validate()},
	} {
		if p.err != nil {
			return fmt.Errorf("%w: policies.%s.%w", ErrInvalid, p.field, p.err)
		}
	}
	return nil
}
