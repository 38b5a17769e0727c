package bench

import (
	"bytes"
	crand "crypto/rand"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/fixture"
)

// DefaultPod returns the manifest Run sends when Options.Manifest is nil:
// fixture.DeploymentPod, a Deployment's pod as its ReplicaSet creates it
// (two containers, env with valueFrom, resources, probes, volumes, owner
// reference), as YAML, about 4.6 KB once converted to JSON. The caller owns
// the returned slice.
func DefaultPod() []byte { return fixture.DeploymentPod() }

// uidPlaceholder marks where each request's uid goes in the pre-encoded body.
// It is not a valid uid, so it cannot collide with one inside the object.
const uidPlaceholder = "@@kadmit-bench-uid@@"

// uidLen is the length of a formatted uid: 8-4-4-4-12 hex digits.
const uidLen = 36

// template is an AdmissionReview request body split around its uid, so each
// request costs a copy and 36 bytes of formatting rather than an encode.
type template struct {
	prefix, suffix []byte
	apiVersion     string
	kind           string // e.g. "Pod", for the report
}

// size is the length in bytes of every body built from t.
func (t *template) size() int { return len(t.prefix) + uidLen + len(t.suffix) }

// body returns a new request body carrying uid, which must be uidLen bytes.
// A new slice each time: the HTTP transport may still read a body after
// RoundTrip returns, so bodies are never reused.
func (t *template) body(uid []byte) []byte {
	b := make([]byte, 0, t.size())
	b = append(b, t.prefix...)
	b = append(b, uid...)
	return append(b, t.suffix...)
}

// newTemplate builds the AdmissionReview envelope (apiVersion "admission.k8s.io/v1"
// or ".../v1beta1") around the single object in manifest (YAML or JSON) for op.
// Kind and resource come from the object's apiVersion/kind, name and
// namespace from its metadata. Errors wrap ErrOptions.
func newTemplate(manifest []byte, apiVersion string, op admissionv1.Operation) (*template, error) {
	obj, err := decodeOne(manifest)
	if err != nil {
		return nil, fmt.Errorf("%w: manifest: %w", ErrOptions, err)
	}
	gvk := obj.GroupVersionKind()
	if gvk.Kind == "" || gvk.Version == "" {
		return nil, fmt.Errorf("%w: manifest: object has no apiVersion or kind", ErrOptions)
	}
	raw, err := obj.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("%w: manifest: %w", ErrOptions, err)
	}
	if bytes.Contains(raw, []byte(uidPlaceholder)) {
		return nil, fmt.Errorf("%w: manifest contains the reserved string %q", ErrOptions, uidPlaceholder)
	}
	gvr, _ := meta.UnsafeGuessKindToResource(gvk)
	kind := metav1.GroupVersionKind{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind}
	resource := metav1.GroupVersionResource{Group: gvr.Group, Version: gvr.Version, Resource: gvr.Resource}
	req := &admissionv1.AdmissionRequest{
		UID:             types.UID(uidPlaceholder),
		Kind:            kind,
		Resource:        resource,
		RequestKind:     &kind,
		RequestResource: &resource,
		Name:            obj.GetName(),
		Namespace:       obj.GetNamespace(),
		Operation:       op,
		// What a controller's request looks like to a webhook.
		UserInfo: authenticationv1.UserInfo{
			Username: "system:serviceaccount:kube-system:replicaset-controller",
			UID:      "d2b1a9f0-5c6e-4e8a-9b3f-1a2c3d4e5f60",
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"},
		},
		DryRun: new(false),
	}
	object := runtime.RawExtension{Raw: raw}
	switch op {
	case admissionv1.Create:
		req.Object = object
		req.Options = rawOptions("CreateOptions")
	case admissionv1.Update:
		req.Object, req.OldObject = object, object
		req.Options = rawOptions("UpdateOptions")
	case admissionv1.Delete:
		req.OldObject = object
		req.Options = rawOptions("DeleteOptions")
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(admission.Review{APIVersion: apiVersion, Kind: admission.ReviewKind, Request: req}); err != nil {
		return nil, fmt.Errorf("%w: encode AdmissionReview: %w", ErrOptions, err)
	}
	body := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	// The placeholder is checked absent from the object, so it occurs once.
	i := bytes.Index(body, []byte(uidPlaceholder))
	return &template{
		prefix:     bytes.Clone(body[:i]),
		suffix:     bytes.Clone(body[i+len(uidPlaceholder):]),
		apiVersion: apiVersion,
		kind:       gvk.Kind,
	}, nil
}

func rawOptions(kind string) runtime.RawExtension {
	return runtime.RawExtension{Raw: []byte(`{"kind":"` + kind + `","apiVersion":"meta.k8s.io/v1"}`)}
}

// decodeOne reads exactly one object from YAML or JSON; empty documents are
// skipped, a second object is an error (the bench sends one object).
func decodeOne(manifest []byte) (*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	var found *unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		if found != nil {
			return nil, errors.New("holds more than one object; the bench sends one")
		}
		found = &unstructured.Unstructured{Object: m}
	}
	if found == nil {
		return nil, errors.New("holds no object")
	}
	if found.IsList() {
		return nil, errors.New("is a List; the bench sends one object")
	}
	return found, nil
}

// uidGen formats random version-4 UUIDs. Not safe for concurrent use: each
// worker has its own. The source is a ChaCha8 stream seeded from crypto/rand,
// so uids are unique in practice without a syscall per request.
type uidGen struct {
	rng *rand.ChaCha8
	buf [uidLen]byte
}

func newUIDGen() *uidGen {
	var seed [32]byte
	_, _ = crand.Read(seed[:]) // never fails on supported platforms (Go 1.24+)
	return &uidGen{rng: rand.NewChaCha8(seed)}
}

// next returns the next uid in a buffer that the following call overwrites.
func (g *uidGen) next() []byte {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], g.rng.Uint64())
	binary.LittleEndian.PutUint64(b[8:], g.rng.Uint64())
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	d := g.buf[:]
	hex.Encode(d[0:8], b[0:4])
	d[8] = '-'
	hex.Encode(d[9:13], b[4:6])
	d[13] = '-'
	hex.Encode(d[14:18], b[6:8])
	d[18] = '-'
	hex.Encode(d[19:23], b[8:10])
	d[23] = '-'
	hex.Encode(d[24:36], b[10:16])
	return d
}
