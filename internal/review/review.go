// Package review runs objects from manifests through kadmit's webhooks
// offline, in the order the API server calls them: every matching mutating
// webhook in order, then every matching validating webhook on the result.
package review

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	storagenames "k8s.io/apiserver/pkg/storage/names"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/manifests"
)

// ErrInput is wrapped by errors about the manifests themselves.
var ErrInput = errors.New("invalid input")

// Document is one object read from a manifest.
type Document struct {
	Source string // file name, or "-" for stdin
	Index  int    // 0-based position in Source (List items count individually)
	Object []byte // JSON
}

func (d Document) String() string { return fmt.Sprintf("%s (document %d)", d.Source, d.Index) }

// Read loads every object from path: a file, a directory (its *.yaml, *.yml
// and *.json files, recursively, in lexical order) or "-" for stdin. YAML may
// hold several documents; a kind: List is expanded into its items. Errors wrap
// ErrInput and name the file and document index.
func Read(path string, stdin io.Reader) ([]Document, error) {
	if path == "-" {
		return decodeAll("-", stdin, -1)
	}
	files, err := manifestFiles(path)
	if err != nil {
		return nil, err
	}
	var out []Document
	for _, f := range files {
		docs, err := readFile(f)
		if err != nil {
			return nil, err
		}
		out = append(out, docs...)
	}
	return out, nil
}

// manifestFiles lists path itself when it is a file, else its *.yaml, *.yml
// and *.json files, recursively, in lexical order.
func manifestFiles(path string) ([]string, error) {
	files, err := manifests.Files(path, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	return files, nil
}

func readFile(path string) ([]Document, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	defer f.Close()
	return decodeAll(path, f, -1)
}

// decodeAll reads the objects of r (manifests.Objects: List items one at
// a time) as Documents numbered from 0. More than maxObjects (negative: no
// bound) is errTooMany, found as the object past the bound is decoded,
// never after the whole file. Input errors wrap ErrInput and name source
// and document.
func decodeAll(source string, r io.Reader, maxObjects int) ([]Document, error) {
	var out []Document
	err := manifests.Objects(r, func(obj []byte) error {
		if maxObjects >= 0 && len(out) >= maxObjects {
			return errTooMany
		}
		out = append(out, Document{Source: source, Index: len(out), Object: obj})
		return nil
	})
	var de *manifests.DecodeError
	if errors.As(err, &de) {
		return nil, fmt.Errorf("%w: %s %w", ErrInput, source, err)
	}
	return out, err
}

// errTooMany stops decodeAll past its object bound.
var errTooMany = errors.New("too many objects")

// Options describe the request each object is reviewed as.
type Options struct {
	// Operation is CREATE (default), UPDATE, DELETE or CONNECT.
	Operation admissionv1.Operation
	// SubResource, e.g. "status".
	SubResource string
	// Old holds the old objects for UPDATE and DELETE, matched to inputs by
	// apiVersion, kind, namespace and name.
	Old []Document
	// UserInfo is the requesting user (`--user`, `--group`, `--uid`); an
	// empty Username is DefaultUser with no groups.
	UserInfo authenticationv1.UserInfo
	// NameGenerator names a CREATE's generateName object between the
	// mutating and validating webhooks (admission.GenerateName); nil is
	// the API server's random one.
	NameGenerator storagenames.NameGenerator
	// Defaults gives the webhooks each object (and old object) as the API
	// server would: with the API's defaults and the default-on mutating
	// admission plugins applied (package apidefaults), and defaults what
	// each mutating webhook returns. Result.Object is then the defaulted
	// object; Result.Patch stays the webhooks' own patches.
	Defaults bool
}

// DefaultUser is the username of a review without Options.UserInfo.
const DefaultUser = "kadmit-review"

// Result is the outcome for one object; its JSON form is one line of
// `kadmit review -o json`. Every documented key (apiVersion, kind, namespace,
// name, allowed, code, message, warnings, patch, object) is always present, so
// scripts can rely on them: namespace and message may be "", warnings and
// patch []. For a CREATE of an object with metadata.generateName and no
// name, name is the one generated between the mutating and the validating
// webhooks, as the API server's registry does (admission.GenerateName:
// random, so it differs from run to run), and object carries it; patch
// holds only the webhooks' operations, not the name.
type Result struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Namespace  string          `json:"namespace"`
	Name       string          `json:"name"`
	Allowed    bool            `json:"allowed"`
	Code       int32           `json:"code"`
	Message    string          `json:"message"`
	Warnings   []string        `json:"warnings"`
	Patch      []jsonedit.Op   `json:"patch"`
	Object     json.RawMessage `json:"object"`
	// Webhooks lists the paths that matched, in call order.
	Webhooks []string `json:"webhooks,omitempty"`
}

// Run reviews one document through webhooks: the mutating ones, each on
// the previous one's output, then, for a CREATE (not of a subresource),
// the object's generateName turned into its name (admission.GenerateName,
// with opts.NameGenerator), then the validating ones on the result, asked
// about that name. It returns an error wrapping ErrInput when the document
// is not a Kubernetes object, its metadata is malformed or its old object
// is missing for UPDATE, and a *admission.PanicError when a policy
// panicked.
func Run(ctx context.Context, webhooks []*admission.Webhook, doc Document, opts Options) (*Result, error) {
	var u unstructured.Unstructured
	if err := u.UnmarshalJSON(doc.Object); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInput, doc, err)
	}
	gvk := u.GroupVersionKind()
	if gvk.Kind == "" || gvk.Version == "" {
		return nil, fmt.Errorf("%w: %s: apiVersion and kind are required", ErrInput, doc)
	}
	op := opts.Operation
	if op == "" {
		op = admissionv1.Create
	}
	gvr, _ := meta.UnsafeGuessKindToResource(gvk)
	req := &admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:         types.UID(uuid.NewUUID()),
		Kind:        metav1.GroupVersionKind{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind},
		Resource:    metav1.GroupVersionResource{Group: gvr.Group, Version: gvr.Version, Resource: gvr.Resource},
		SubResource: opts.SubResource,
		Name:        u.GetName(),
		Namespace:   u.GetNamespace(),
		Operation:   op,
		UserInfo:    opts.UserInfo,
		Object:      runtime.RawExtension{Raw: doc.Object},
	}}
	if req.UserInfo.Username == "" {
		req.UserInfo = authenticationv1.UserInfo{Username: DefaultUser}
	}
	req.RequestKind, req.RequestResource, req.RequestSubResource = &req.Kind, &req.Resource, req.SubResource
	// The options object the API server passes with every CREATE, UPDATE
	// and DELETE (request.options in CEL, AdmissionRequest.options for
	// webhooks), the same as `kadmit test` builds.
	options, _, err := admission.RequestOptions(op, nil, false)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInput, doc, err)
	}
	req.Options = runtime.RawExtension{Raw: options}
	if op == admissionv1.Update || op == admissionv1.Delete {
		old, ok := findOld(opts.Old, gvk, u.GetNamespace(), u.GetName())
		if !ok {
			return nil, fmt.Errorf("%w: %s: %s needs the old %s %s (--old)", ErrInput, doc, op, gvk.Kind, u.GetName())
		}
		req.OldObject = runtime.RawExtension{Raw: old}
		if op == admissionv1.Delete {
			req.Object = runtime.RawExtension{}
		}
	}

	if opts.Defaults {
		if err := applyDefaults(doc, req); err != nil {
			return nil, err
		}
	}

	res := &Result{APIVersion: u.GetAPIVersion(), Kind: gvk.Kind, Namespace: u.GetNamespace(), Name: u.GetName(), Allowed: true, Code: 200, Warnings: []string{}, Patch: []jsonedit.Op{}}
	// Mutating webhooks first, each seeing the previous one's output, then
	// validating webhooks on the final object, as the API server does.
	for _, phase := range []admission.Type{admission.Mutating, admission.Validating} {
		if phase == admission.Validating && op == admissionv1.Create && req.SubResource == "" {
			// Between the phases the API server's registry names a
			// generateName object, and validating admission is asked
			// about that name (admission.GenerateName).
			obj, name, err := admission.GenerateName(req.Object.Raw, opts.NameGenerator)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %w", ErrInput, doc, err)
			}
			req.Object.Raw = obj
			if req.Name == "" {
				req.Name, res.Name = name, name
			}
		}
		for _, wh := range webhooks {
			if wh.Type != phase {
				continue
			}
			out, err := wh.Review(ctx, req)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", doc, wh.Path, err)
			}
			if out.Matched == 0 {
				continue
			}
			res.Webhooks = append(res.Webhooks, wh.Path)
			res.Warnings = append(res.Warnings, out.Response.Warnings...)
			if !out.Response.Allowed {
				res.Allowed = false
				res.Code, res.Message = out.Response.Result.Code, out.Response.Result.Message
				res.Object, res.Patch = req.Object.Raw, []jsonedit.Op{}
				return res, nil
			}
			// The patch is each webhook's, in call order, as the API
			// server applies them.
			res.Patch = append(res.Patch, out.Patch...)
			if out.Object != nil {
				req.Object = runtime.RawExtension{Raw: out.Object}
				if opts.Defaults {
					if err := defaultMutated(doc, req); err != nil {
						return nil, err
					}
				}
			}
		}
	}
	res.Object = req.Object.Raw
	return res, nil
}

func findOld(old []Document, gvk schema.GroupVersionKind, ns, name string) ([]byte, bool) {
	for _, d := range old {
		var u unstructured.Unstructured
		if err := u.UnmarshalJSON(d.Object); err != nil {
			continue
		}
		if u.GroupVersionKind() == gvk && u.GetNamespace() == ns && u.GetName() == name {
			return d.Object, true
		}
	}
	if len(old) == 1 {
		return old[0].Object, true
	}
	return nil, false
}
