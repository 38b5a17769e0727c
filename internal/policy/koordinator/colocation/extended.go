package colocation

import (
	"bytes"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/quantity"
)

// annotationError is a malformed extended-resource-spec annotation, which
// upstream's handler answers with 500 (mutating_handler.go:89-91).
type annotationError struct{ err error }

func (e *annotationError) Error() string { return e.err.Error() }
func (e *annotationError) Unwrap() error { return e.err }

// AnnotationExtendedResourceSpec holds a pod's batch resources per
// container for koordlet and the runtime proxy, which do not see the pod
// spec (apis/extension/resource.go:34-37).
const AnnotationExtendedResourceSpec = "node.koordinator.sh/extended-resource-spec"

// extendedSpecAnnotation returns the pod's extended-resource-spec
// annotation as doc.Decode reads it: has false when there is none, the
// decoder's error when it is not a string or the annotations are not an
// object. Annotations that jsonedit.MayHoldString says nowhere spell the
// name have no member of that name: they are not parsed (most pods have
// no such annotation, and a pod's annotations are often long: checksums,
// last-applied configurations).
func extendedSpecAnnotation(doc *jsonedit.Doc) (cur string, has bool, err error) {
	raw, err := doc.Get("metadata", "annotations")
	if err == nil && len(raw) > 0 && raw[0] == '{' && !jsonedit.MayHoldString(raw, AnnotationExtendedResourceSpec) {
		return "", false, nil
	}
	has, err = doc.Decode(&cur, "metadata", "annotations", AnnotationExtendedResourceSpec)
	return cur, has, err
}

// extendedResourceSpec and extendedContainerSpec are upstream's
// ExtendedResourceSpec and ExtendedResourceContainerSpec
// (apis/extension/resource.go:72-79): encoding/json writes them exactly as
// upstream's json.Marshal does (sorted keys, canonical quantities).
type extendedResourceSpec struct {
	Containers map[string]extendedContainerSpec `json:"containers,omitempty"`
}

type extendedContainerSpec struct {
	Limits   corev1.ResourceList `json:"limits,omitempty"`
	Requests corev1.ResourceList `json:"requests,omitempty"`
}

// extendedResources is mutateByExtendedResources
// (pkg/webhook/pod/mutating/extended_resource_spec.go:33-80), run by
// upstream on every pod CREATE after the profiles (mutating_handler.go:124-132):
// the node.koordinator.sh/extended-resource-spec annotation lists, per
// regular container, its batch-cpu and batch-memory requests and limits,
// and is rewritten when it says something else. cur and has are the
// annotation as the profiles left it; translated is translateResources'
// result, nil when it did not run. A pod whose spec cannot name a batch
// resource and that has no such annotation costs one scan of its spec text.
func extendedResources(doc *jsonedit.Doc, cur string, has bool, translated []containerLists) error {
	containers := translated
	if containers == nil {
		spec, err := doc.Get("spec")
		if err != nil {
			return err
		}
		if !has && !bytes.Contains(spec, []byte("batch-")) && bytes.IndexByte(spec, '\\') < 0 {
			return nil
		}
		var cs []containerResources
		if _, err := doc.Decode(&cs, "spec", "containers"); err != nil {
			return err
		}
		for _, c := range cs {
			containers = append(containers, containerLists{name: c.Name, req: corev1.ResourceList(c.Resources.Requests), lim: corev1.ResourceList(c.Resources.Limits)})
		}
	}
	want := extendedResourceSpec{}
	for _, c := range containers {
		r := extendedContainerSpec{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
		for _, n := range []corev1.ResourceName{BatchCPU, BatchMemory} {
			if q, ok := c.req[n]; ok {
				r.Requests[n] = q
			}
			if q, ok := c.lim[n]; ok {
				r.Limits[n] = q
			}
		}
		if len(r.Requests) == 0 && len(r.Limits) == 0 {
			continue
		}
		if want.Containers == nil {
			want.Containers = map[string]extendedContainerSpec{}
		}
		want.Containers[c.name] = r
	}
	wantJSON, err := json.Marshal(want)
	if err != nil {
		return err
	}
	if has {
		// Quantities in the annotation go through internal/quantity's bound.
		var got struct {
			Containers map[string]struct {
				Limits   quantity.List `json:"limits,omitempty"`
				Requests quantity.List `json:"requests,omitempty"`
			} `json:"containers,omitempty"`
		}
		if err := json.Unmarshal([]byte(cur), &got); err != nil {
			return &annotationError{fmt.Errorf("failed to get current extended resource spec, err: %w", err)}
		}
		norm := extendedResourceSpec{}
		for name, c := range got.Containers {
			if norm.Containers == nil {
				norm.Containers = map[string]extendedContainerSpec{}
			}
			norm.Containers[name] = extendedContainerSpec{Limits: corev1.ResourceList(c.Limits), Requests: corev1.ResourceList(c.Requests)}
		}
		if gotJSON, err := json.Marshal(norm); err == nil && bytes.Equal(gotJSON, wantJSON) {
			return nil
		}
	} else if want.Containers == nil {
		return nil
	}
	return doc.Set(string(wantJSON), "metadata", "annotations", AnnotationExtendedResourceSpec)
}
