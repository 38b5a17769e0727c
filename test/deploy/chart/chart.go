// Package chart renders and lints deploy/helm/kadmit with the Helm Go
// library, exactly as `helm template` and `helm lint` do. The tests and the
// generator of deploy/manifests share it, so what is checked in is what is
// tested.
package chart

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chartv2 "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Default release name and namespace of deploy/manifests and of the docs.
const (
	ReleaseName = "kadmit"
	Namespace   = "kadmit-system"
	// KubeVersion is what rendering and linting assume (helm template
	// --kube-version): the API server version of the tests.
	KubeVersion = "v1.37.1"
)

// RepoRoot walks up from the working directory to the directory holding
// deploy/helm/kadmit (the main module's root).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "deploy", "helm", "kadmit", "Chart.yaml")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("chart: deploy/helm/kadmit not found above the working directory")
		}
		dir = parent
	}
}

// Dir is the chart directory.
func Dir() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "deploy", "helm", "kadmit"), nil
}

// Rendered is one `helm template` result.
type Rendered struct {
	// Manifest is the release manifest as helm prints it (hooks excluded).
	Manifest string
	// Objects are the manifest's objects in Helm's install order.
	Objects []*unstructured.Unstructured
	// Hooks are the hook objects (pre-delete uninstall Job and its RBAC).
	Hooks []*unstructured.Unstructured
}

// Render runs a client-only install (what `helm template RELEASE CHART -n
// NAMESPACE --set ...` runs) with values merged over values.yaml.
func Render(releaseName, namespace string, values map[string]any) (*Rendered, error) {
	dir, err := Dir()
	if err != nil {
		return nil, err
	}
	ch, err := loader.LoadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("chart: load %s: %w", dir, err)
	}
	return RenderChart(ch, releaseName, namespace, values)
}

// RenderChart is Render for a loaded chart.
func RenderChart(ch *chartv2.Chart, releaseName, namespace string, values map[string]any) (*Rendered, error) {
	cfg := action.NewConfiguration()
	inst := action.NewInstall(cfg)
	inst.DryRunStrategy = action.DryRunClient
	inst.ReleaseName = releaseName
	inst.Namespace = namespace
	inst.Replace = true
	// Client-only rendering assumes Kubernetes v1.20 unless told; render for
	// the API server version the chart is tested against.
	kv, err := common.ParseKubeVersion(KubeVersion)
	if err != nil {
		return nil, err
	}
	inst.KubeVersion = kv
	if values == nil {
		values = map[string]any{}
	}
	rel, err := inst.Run(ch, values)
	if err != nil {
		return nil, fmt.Errorf("chart: render: %w", err)
	}
	r, ok := rel.(*releasev1.Release)
	if !ok {
		return nil, fmt.Errorf("chart: render returned %T", rel)
	}
	out := &Rendered{Manifest: r.Manifest}
	if out.Objects, err = Decode(r.Manifest); err != nil {
		return nil, err
	}
	for _, h := range r.Hooks {
		objs, err := Decode(h.Manifest)
		if err != nil {
			return nil, fmt.Errorf("chart: hook %s: %w", h.Path, err)
		}
		out.Hooks = append(out.Hooks, objs...)
	}
	return out, nil
}

// Decode splits a multi-document YAML stream into objects, skipping empty
// documents.
func Decode(manifest string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	d := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifest)))
	for {
		doc, err := d.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("chart: decode %q: %w", firstLine(doc), err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

// Find returns the object of kind and name, or nil.
func (r *Rendered) Find(kind, name string) *unstructured.Unstructured {
	for _, o := range append(append([]*unstructured.Unstructured{}, r.Objects...), r.Hooks...) {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// Kinds lists "Kind/name" of every manifest object, sorted, for messages.
func (r *Rendered) Kinds() []string {
	var out []string
	for _, o := range r.Objects {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	sort.Strings(out)
	return out
}

// Lint runs what `helm lint` runs on the chart with values merged over
// values.yaml, and returns every message.
func Lint(values map[string]any) ([]support.Message, error) {
	dir, err := Dir()
	if err != nil {
		return nil, err
	}
	kv, err := common.ParseKubeVersion(KubeVersion)
	if err != nil {
		return nil, err
	}
	l := lint.RunAll(dir, values, Namespace, lint.WithKubeVersion(kv))
	return l.Messages, nil
}

// Severity names a lint message's severity.
func Severity(m support.Message) string {
	switch m.Severity {
	case support.InfoSev:
		return "INFO"
	case support.WarningSev:
		return "WARNING"
	case support.ErrorSev:
		return "ERROR"
	}
	return "UNKNOWN"
}

func firstLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
