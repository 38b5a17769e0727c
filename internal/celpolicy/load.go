// Package celpolicy loads and evaluates the admission policies users write
// themselves — ValidatingAdmissionPolicy and MutatingAdmissionPolicy with
// their bindings and params — with the API server's own code
// (k8s.io/apiserver v0.37.1, pkg/admission/plugin/policy/{generic,
// validating,mutating}, pkg/admission/plugin/webhook/matchconditions,
// pkg/cel/environment). This package holds only the glue the API server
// keeps unexported: the file loader, API defaulting, policy compilation and
// the per-request plumbing (attributes, namespace lookup, params store,
// warnings and audit annotations), each mirroring the upstream function its
// comment names.
package celpolicy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/kadmit/kadmit/internal/manifests"
)

// Bounds on what Load reads: bad input gets a clear error and bounded cost.
const (
	// MaxFileBytes is the largest policy or params file Load reads.
	MaxFileBytes = 4 << 20
	// MaxDocuments is the most documents (policies, bindings and params
	// together) one Load call accepts: 2,000, what the process can afford
	// (1,000 policies with a binding each). Measured per trivial policy
	// (BenchmarkPolicyCost): 19 KB of heap and about 1 ms of CPU to load
	// and compile, since policies without variables share one compiler
	// (policyCompiler; 129 KB and 23 ms before), so 1,000 policies hold
	// about 19 MiB and reload in about a CPU-second; each matching policy
	// still costs its evaluation on every request it matches.
	MaxDocuments = 2000
	// MaxFiles is the most files a directory may hold for Load.
	MaxFiles = 1000
)

// ErrInput is wrapped by every error about the policy files themselves.
var ErrInput = errors.New("invalid policy input")

// Source names where a document came from: "file (document N)", N counted
// from 0 over the non-empty documents of the file.
type Source struct {
	File  string
	Index int
}

func (s Source) String() string { return fmt.Sprintf("%s (document %d)", s.File, s.Index) }

// Set is what Load read: the four policy kinds (MutatingAdmissionPolicy
// v1beta1 converted to v1) and every other object as a param, each with
// the API server's defaults applied. Order is file order (files in lexical
// order), which is the order Engine evaluates policies in.
type Set struct {
	Validating        []*admissionregistrationv1.ValidatingAdmissionPolicy
	ValidatingBinding []*admissionregistrationv1.ValidatingAdmissionPolicyBinding
	Mutating          []*admissionregistrationv1.MutatingAdmissionPolicy
	MutatingBinding   []*admissionregistrationv1.MutatingAdmissionPolicyBinding
	// Params are every other object, available to paramRef.
	Params []*unstructured.Unstructured
	// Sources maps "Kind/name" (policies and bindings) and
	// "apiVersion/Kind/namespace/name" (params) to where each was read.
	Sources map[string]Source
}

// Load reads every path (a file, or a directory: its *.yaml, *.yml and
// *.json files, recursively, in lexical order) into one Set. YAML may hold
// several documents; a kind: List is expanded. Errors wrap ErrInput and
// name the file and document: a document that is not a Kubernetes object,
// a policy kind with a field the API does not have, a duplicate name, a
// binding naming a policy that is not loaded, an expression that does not
// compile (see Check).
func Load(paths ...string) (*Set, error) {
	return LoadAll(paths, nil)
}

// Document is one named stream of YAML or JSON documents held in memory,
// such as one data key of a ConfigMap (see ConfigMapDocuments). Name is
// what errors and Source report in place of a file name.
type Document struct {
	Name string
	Data string
}

// LoadAll reads paths as Load does, then docs in the order given, into one
// Set: a binding in one may name a policy or param in another. Each
// document is held to MaxFileBytes, all of them together to MaxDocuments
// objects, and there may be at most MaxFiles docs. Errors wrap ErrInput and
// name the file or document. Policies may not match SensitiveGroups (see
// LoadWith to lift that).
func LoadAll(paths []string, docs []Document) (*Set, error) {
	return LoadWith(LoadOptions{}, paths, docs)
}

// LoadWith reads paths and docs as LoadAll does, with opts.
func LoadWith(opts LoadOptions, paths []string, docs []Document) (*Set, error) {
	if len(docs) > MaxFiles {
		return nil, fmt.Errorf("%w: %d policy documents, more than %d", ErrInput, len(docs), MaxFiles)
	}
	s := &Set{Sources: map[string]Source{}}
	for _, p := range paths {
		files, err := listFiles(p)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			if err := s.addFile(f); err != nil {
				return nil, err
			}
		}
	}
	for _, d := range docs {
		if err := s.addReader(d.Name, io.LimitReader(strings.NewReader(d.Data), MaxFileBytes+1)); err != nil {
			return nil, err
		}
	}
	if err := s.validate(opts); err != nil {
		return nil, err
	}
	return s, nil
}

// LoadReader reads one stream of YAML or JSON documents named name into a
// Set, as Load does for a file.
func LoadReader(name string, r io.Reader) (*Set, error) {
	s := &Set{Sources: map[string]Source{}}
	if err := s.addReader(name, io.LimitReader(r, MaxFileBytes+1)); err != nil {
		return nil, err
	}
	if err := s.validate(LoadOptions{}); err != nil {
		return nil, err
	}
	return s, nil
}

func listFiles(path string) ([]string, error) {
	n := 0
	files, err := manifests.Files(path, func(string) (bool, error) {
		if n++; n > MaxFiles {
			return false, fmt.Errorf("%s holds more than %d policy files", path, MaxFiles)
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	return files, nil
}

func (s *Set) addFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInput, err)
	}
	defer f.Close()
	return s.addReader(path, io.LimitReader(f, MaxFileBytes+1))
}

func (s *Set) count() int {
	return len(s.Validating) + len(s.ValidatingBinding) + len(s.Mutating) + len(s.MutatingBinding) + len(s.Params)
}

func (s *Set) addReader(name string, r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInput, name, err)
	}
	if len(data) > MaxFileBytes {
		return fmt.Errorf("%w: %s: larger than %d bytes", ErrInput, name, MaxFileBytes)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	index := 0
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("%w: %s: %w", ErrInput, Source{name, index}, err)
		}
		t := bytes.TrimSpace(raw)
		if len(t) == 0 || string(t) == "null" {
			continue
		}
		var u unstructured.Unstructured
		if err := u.UnmarshalJSON(raw); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrInput, Source{name, index}, err)
		}
		items := []unstructured.Unstructured{u}
		if u.IsList() {
			list, err := u.ToList()
			if err != nil {
				return fmt.Errorf("%w: %s: %w", ErrInput, Source{name, index}, err)
			}
			items = list.Items
		}
		for i := range items {
			if s.count() >= MaxDocuments {
				return fmt.Errorf("%w: %s: more than %d documents", ErrInput, Source{name, index}, MaxDocuments)
			}
			if err := s.add(&items[i], Source{name, index}); err != nil {
				return fmt.Errorf("%w: %s: %w", ErrInput, Source{name, index}, err)
			}
			index++
		}
	}
}

// Add adds one object (a policy, a binding or a param) to the set, as
// Load does for each document, and reports where it came from with src.
// Call Validate when done adding.
func (s *Set) Add(obj *unstructured.Unstructured, src Source) error {
	if s.Sources == nil {
		s.Sources = map[string]Source{}
	}
	if err := s.add(obj, src); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInput, src, err)
	}
	return nil
}

// Validate checks the set as Load does once every document is read.
func (s *Set) Validate() error { return s.validate(LoadOptions{}) }

// ValidateWith checks the set as LoadWith(opts, ...) does.
func (s *Set) ValidateWith(opts LoadOptions) error { return s.validate(opts) }

func (s *Set) add(u *unstructured.Unstructured, src Source) error {
	gvk := u.GroupVersionKind()
	if gvk.Kind == "" || gvk.Version == "" {
		return errors.New("apiVersion and kind are required")
	}
	if u.GetName() == "" {
		return fmt.Errorf("%s: metadata.name is required", gvk.Kind)
	}
	isPolicyGroup := gvk.Group == admissionregistrationv1.GroupName
	kind := gvk.Kind
	if isPolicyGroup {
		switch kind {
		case "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			if gvk.Version != "v1" && gvk.Version != "v1beta1" {
				return fmt.Errorf("%s: apiVersion %s: kadmit reads admissionregistration.k8s.io/v1 (or v1beta1)", kind, u.GetAPIVersion())
			}
		case "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding":
			if gvk.Version != "v1" && gvk.Version != "v1beta1" {
				return fmt.Errorf("%s: apiVersion %s: kadmit reads admissionregistration.k8s.io/v1 or v1beta1", kind, u.GetAPIVersion())
			}
		default:
			isPolicyGroup = false
		}
	}
	if !isPolicyGroup {
		key := paramKey(u)
		if prev, ok := s.Sources[key]; ok {
			return fmt.Errorf("%s %s is also defined at %s", gvk.Kind, describe(u), prev)
		}
		s.Sources[key] = src
		s.Params = append(s.Params, u)
		return nil
	}
	key := kind + "/" + u.GetName()
	if prev, ok := s.Sources[key]; ok {
		return fmt.Errorf("%s %s is also defined at %s", kind, u.GetName(), prev)
	}
	raw, err := u.MarshalJSON()
	if err != nil {
		return err
	}
	// The v1beta1 kinds have exactly the v1 fields, so a strict decode into
	// the v1 type is the conversion (the API server's conversion functions
	// for these types are field-by-field copies too).
	switch kind {
	case "ValidatingAdmissionPolicy":
		var p admissionregistrationv1.ValidatingAdmissionPolicy
		if err := decodeStrict(raw, &p); err != nil {
			return fmt.Errorf("%s %s: %w", kind, u.GetName(), err)
		}
		defaultValidatingPolicy(&p)
		s.Validating = append(s.Validating, &p)
	case "ValidatingAdmissionPolicyBinding":
		var b admissionregistrationv1.ValidatingAdmissionPolicyBinding
		if err := decodeStrict(raw, &b); err != nil {
			return fmt.Errorf("%s %s: %w", kind, u.GetName(), err)
		}
		defaultMatchResources(b.Spec.MatchResources)
		s.ValidatingBinding = append(s.ValidatingBinding, &b)
	case "MutatingAdmissionPolicy":
		var p admissionregistrationv1.MutatingAdmissionPolicy
		if err := decodeStrict(raw, &p); err != nil {
			return fmt.Errorf("%s %s: %w", kind, u.GetName(), err)
		}
		defaultMutatingPolicy(&p)
		s.Mutating = append(s.Mutating, &p)
	case "MutatingAdmissionPolicyBinding":
		var b admissionregistrationv1.MutatingAdmissionPolicyBinding
		if err := decodeStrict(raw, &b); err != nil {
			return fmt.Errorf("%s %s: %w", kind, u.GetName(), err)
		}
		defaultMatchResources(b.Spec.MatchResources)
		s.MutatingBinding = append(s.MutatingBinding, &b)
	}
	s.Sources[key] = src
	return nil
}

func paramKey(u *unstructured.Unstructured) string {
	return u.GetAPIVersion() + "/" + u.GetKind() + "/" + u.GetNamespace() + "/" + u.GetName()
}

func describe(u *unstructured.Unstructured) string {
	if u.GetNamespace() != "" {
		return u.GetNamespace() + "/" + u.GetName()
	}
	return u.GetName()
}

// decodeStrict decodes raw into v refusing fields v does not have: a
// misspelt field in a policy is an error here, where the API server would
// drop it with a warning and the policy would silently do less.
func decodeStrict(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	return nil
}

// The defaults below mirror k8s.io/kubernetes pkg/apis/admissionregistration/
// v1/defaults.go (v1.37.1): SetDefaults_ValidatingAdmissionPolicySpec,
// SetDefaults_MutatingAdmissionPolicySpec, SetDefaults_MatchResources and
// SetDefaults_Rule (via NamedRuleWithOperations). The generic matcher
// refuses nil selectors (generic/policy_matcher.go), so they matter.

func defaultValidatingPolicy(p *admissionregistrationv1.ValidatingAdmissionPolicy) {
	if p.Spec.FailurePolicy == nil {
		fp := admissionregistrationv1.Fail
		p.Spec.FailurePolicy = &fp
	}
	defaultMatchResources(p.Spec.MatchConstraints)
}

func defaultMutatingPolicy(p *admissionregistrationv1.MutatingAdmissionPolicy) {
	if p.Spec.FailurePolicy == nil {
		fp := admissionregistrationv1.Fail
		p.Spec.FailurePolicy = &fp
	}
	// No default for reinvocationPolicy: the API server has none for a
	// MutatingAdmissionPolicy (k8s.io/kubernetes v1.37.1
	// pkg/apis/admissionregistration/v1/defaults.go:122-127 sets only
	// failurePolicy; the webhook's Never default at :76-79 is for
	// MutatingWebhooks) and refuses the policy without one
	// (validation/validation.go:1417-1418), so check refuses it too.
	defaultMatchResources(p.Spec.MatchConstraints)
}

func defaultMatchResources(m *admissionregistrationv1.MatchResources) {
	if m == nil {
		return
	}
	if m.MatchPolicy == nil {
		mp := admissionregistrationv1.Equivalent
		m.MatchPolicy = &mp
	}
	if m.NamespaceSelector == nil {
		m.NamespaceSelector = &metav1.LabelSelector{}
	}
	if m.ObjectSelector == nil {
		m.ObjectSelector = &metav1.LabelSelector{}
	}
	for _, rs := range [][]admissionregistrationv1.NamedRuleWithOperations{m.ResourceRules, m.ExcludeResourceRules} {
		for i := range rs {
			if rs[i].Scope == nil {
				sc := admissionregistrationv1.AllScopes
				rs[i].Scope = &sc
			}
		}
	}
}

// validate checks what the API server's validation would refuse and kadmit
// depends on: matchConstraints present with resourceRules, bindings naming
// a loaded policy with validationActions, expressions that compile; and,
// unless opts allow it, that no policy matches SensitiveGroups.
func (s *Set) validate(opts LoadOptions) error {
	vaps := map[string]bool{}
	for _, p := range s.Validating {
		src := s.Sources["ValidatingAdmissionPolicy/"+p.Name]
		if p.Spec.MatchConstraints == nil || len(p.Spec.MatchConstraints.ResourceRules) == 0 {
			return fmt.Errorf("%w: %s: ValidatingAdmissionPolicy %s: spec.matchConstraints.resourceRules: Required value", ErrInput, src, p.Name)
		}
		if !opts.AllowSensitiveGroups {
			if err := checkSensitive(p.Spec.MatchConstraints); err != nil {
				return fmt.Errorf("%w: %s: ValidatingAdmissionPolicy %s: %w", ErrInput, src, p.Name, err)
			}
		}
		if len(p.Spec.Validations) == 0 && len(p.Spec.AuditAnnotations) == 0 {
			return fmt.Errorf("%w: %s: ValidatingAdmissionPolicy %s: spec.validations: Required value: validations or auditAnnotations must contain at least one item", ErrInput, src, p.Name)
		}
		if err := checkValidating(p); err != nil {
			return fmt.Errorf("%w: %s: ValidatingAdmissionPolicy %s: %w", ErrInput, src, p.Name, err)
		}
		vaps[p.Name] = true
	}
	for _, b := range s.ValidatingBinding {
		src := s.Sources["ValidatingAdmissionPolicyBinding/"+b.Name]
		if !vaps[b.Spec.PolicyName] {
			return fmt.Errorf("%w: %s: ValidatingAdmissionPolicyBinding %s: spec.policyName: no ValidatingAdmissionPolicy %q is loaded", ErrInput, src, b.Name, b.Spec.PolicyName)
		}
		if len(b.Spec.ValidationActions) == 0 {
			return fmt.Errorf("%w: %s: ValidatingAdmissionPolicyBinding %s: spec.validationActions: Required value", ErrInput, src, b.Name)
		}
		for _, a := range b.Spec.ValidationActions {
			switch a {
			case admissionregistrationv1.Deny, admissionregistrationv1.Warn, admissionregistrationv1.Audit:
			default:
				return fmt.Errorf("%w: %s: ValidatingAdmissionPolicyBinding %s: spec.validationActions: Unsupported value: %q: supported values: \"Audit\", \"Deny\", \"Warn\"", ErrInput, src, b.Name, a)
			}
		}
		if err := checkParamRef(b.Spec.ParamRef); err != nil {
			return fmt.Errorf("%w: %s: ValidatingAdmissionPolicyBinding %s: %w", ErrInput, src, b.Name, err)
		}
	}
	maps := map[string]bool{}
	for _, p := range s.Mutating {
		src := s.Sources["MutatingAdmissionPolicy/"+p.Name]
		if p.Spec.MatchConstraints == nil || len(p.Spec.MatchConstraints.ResourceRules) == 0 {
			return fmt.Errorf("%w: %s: MutatingAdmissionPolicy %s: spec.matchConstraints.resourceRules: Required value", ErrInput, src, p.Name)
		}
		if !opts.AllowSensitiveGroups {
			if err := checkSensitive(p.Spec.MatchConstraints); err != nil {
				return fmt.Errorf("%w: %s: MutatingAdmissionPolicy %s: %w", ErrInput, src, p.Name, err)
			}
		}
		switch p.Spec.ReinvocationPolicy {
		case admissionregistrationv1.NeverReinvocationPolicy, admissionregistrationv1.IfNeededReinvocationPolicy:
		case "":
			return fmt.Errorf("%w: %s: MutatingAdmissionPolicy %s: spec.reinvocationPolicy: Required value", ErrInput, src, p.Name)
		default:
			return fmt.Errorf("%w: %s: MutatingAdmissionPolicy %s: spec.reinvocationPolicy: Unsupported value: %q", ErrInput, src, p.Name, p.Spec.ReinvocationPolicy)
		}
		if err := checkMutating(p); err != nil {
			return fmt.Errorf("%w: %s: MutatingAdmissionPolicy %s: %w", ErrInput, src, p.Name, err)
		}
		maps[p.Name] = true
	}
	for _, b := range s.MutatingBinding {
		src := s.Sources["MutatingAdmissionPolicyBinding/"+b.Name]
		if !maps[b.Spec.PolicyName] {
			return fmt.Errorf("%w: %s: MutatingAdmissionPolicyBinding %s: spec.policyName: no MutatingAdmissionPolicy %q is loaded", ErrInput, src, b.Name, b.Spec.PolicyName)
		}
		if err := checkParamRef(b.Spec.ParamRef); err != nil {
			return fmt.Errorf("%w: %s: MutatingAdmissionPolicyBinding %s: %w", ErrInput, src, b.Name, err)
		}
	}
	return nil
}

func checkParamRef(r *admissionregistrationv1.ParamRef) error {
	if r == nil {
		return nil
	}
	if r.Name != "" && r.Selector != nil {
		return errors.New("spec.paramRef: name and selector are mutually exclusive")
	}
	if r.Name == "" && r.Selector == nil {
		return errors.New("spec.paramRef: one of name or selector must be set")
	}
	if r.ParameterNotFoundAction == nil {
		return errors.New("spec.paramRef.parameterNotFoundAction: Required value")
	}
	return nil
}
