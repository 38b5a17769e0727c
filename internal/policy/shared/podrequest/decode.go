package podrequest

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/quantity"
)

// DecodeSpec decodes from a pod spec's JSON (spec, or a template's
// spec) only what Effective reads: containers' and init containers' names,
// restartPolicy and resources, spec.overhead and spec.resources. Every
// quantity goes through quantity.Parse, so an out-of-range one is refused
// from its text before any arithmetic, with an error naming the field under
// path, e.g. `spec.containers[0].resources.requests.cpu: quantity 1e9999999
// is out of range (|value| must be below 9223372036854775807m)`. Quantities
// Effective does not read (volumes' sizeLimit and the like) are not parsed
// at all, unlike json.Unmarshal into a corev1.PodSpec. null or empty raw is
// an empty spec.
func DecodeSpec(raw []byte, path string) (*corev1.PodSpec, error) {
	spec := &corev1.PodSpec{}
	if len(raw) == 0 {
		return spec, nil
	}
	var s struct {
		Containers     []json.RawMessage `json:"containers"`
		InitContainers []json.RawMessage `json:"initContainers"`
		Overhead       json.RawMessage   `json:"overhead"`
		Resources      json.RawMessage   `json:"resources"`
	}
	if err := jsonedit.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var err error
	if spec.Containers, err = decodeContainers(s.Containers, path+".containers"); err != nil {
		return nil, err
	}
	if spec.InitContainers, err = decodeContainers(s.InitContainers, path+".initContainers"); err != nil {
		return nil, err
	}
	if spec.Overhead, err = decodeList(s.Overhead, path+".overhead"); err != nil {
		return nil, err
	}
	if len(s.Resources) > 0 && string(s.Resources) != "null" {
		r, err := decodeResources(s.Resources, path+".resources")
		if err != nil {
			return nil, err
		}
		spec.Resources = &r
	}
	return spec, nil
}

func decodeContainers(raws []json.RawMessage, path string) ([]corev1.Container, error) {
	if raws == nil {
		return nil, nil
	}
	out := make([]corev1.Container, len(raws))
	for i, raw := range raws {
		p := fmt.Sprintf("%s[%d]", path, i)
		var c struct {
			Name          string                         `json:"name"`
			RestartPolicy *corev1.ContainerRestartPolicy `json:"restartPolicy"`
			Resources     json.RawMessage                `json:"resources"`
		}
		if err := jsonedit.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		r, err := decodeResources(c.Resources, p+".resources")
		if err != nil {
			return nil, err
		}
		out[i] = corev1.Container{Name: c.Name, RestartPolicy: c.RestartPolicy, Resources: r}
	}
	return out, nil
}

func decodeResources(raw json.RawMessage, path string) (corev1.ResourceRequirements, error) {
	var r struct {
		Limits   json.RawMessage `json:"limits"`
		Requests json.RawMessage `json:"requests"`
	}
	if len(raw) == 0 {
		return corev1.ResourceRequirements{}, nil
	}
	if err := jsonedit.Unmarshal(raw, &r); err != nil {
		return corev1.ResourceRequirements{}, fmt.Errorf("%s: %w", path, err)
	}
	limits, err := decodeList(r.Limits, path+".limits")
	if err != nil {
		return corev1.ResourceRequirements{}, err
	}
	requests, err := decodeList(r.Requests, path+".requests")
	if err != nil {
		return corev1.ResourceRequirements{}, err
	}
	return corev1.ResourceRequirements{Limits: limits, Requests: requests}, nil
}

// decodeList decodes a resource list with quantity.List; errors name
// path.<resource>.
func decodeList(raw json.RawMessage, path string) (corev1.ResourceList, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var l quantity.List
	if err := jsonedit.Unmarshal(raw, &l); err != nil {
		return nil, quantity.Prefix(path, err)
	}
	return corev1.ResourceList(l), nil
}
