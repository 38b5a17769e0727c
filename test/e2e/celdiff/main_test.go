// Package celdiff is the differential test of kadmit's declared-policy
// engine (internal/celpolicy) against the real kube-apiserver's in-tree
// ValidatingAdmissionPolicy and MutatingAdmissionPolicy plugins: each
// policy set of examples/cel is loaded into both, the objects of its test
// suite are sent to the API server as server-side dry-run creates and
// updates and evaluated by the engine, and decisions, codes, messages,
// warnings and mutated objects must be identical.
//
// The control plane is taken from KADMIT_CONTROLPLANE_DIR (default
// ~/.cache/kadmit/controlplane/v1.37.1), so the same test targets each
// minor: on kube-apiserver 1.35, where MutatingAdmissionPolicy is beta and
// off, it starts the API server with the MutatingAdmissionPolicy feature
// gate and admissionregistration.k8s.io/v1beta1 enabled and creates the
// mutating policies as v1beta1.
//
// Without the binaries the test skips, unless KADMIT_E2E_REQUIRED=1.
package celdiff

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/kadmit/kadmit/internal/policysuite"
	"github.com/kadmit/kadmit/test/controlplane"
)

var world struct {
	cp  *controlplane.ControlPlane
	dyn dynamic.Interface
	// server sends the dry runs and creates the policies: the code of
	// `kadmit test --server` (internal/policysuite/server.go).
	server *policysuite.Server
	minor  int
	// mapVersion is the admissionregistration version the server serves
	// MutatingAdmissionPolicy in: v1 from 1.36, v1beta1 on 1.35.
	mapVersion string
	skip       string
	// auditLog is the API server's audit log; auditID the Audit-ID header
	// the next request carries (requests are sequential).
	auditLog string
	auditID  atomic.Value
}

// auditIDTransport sends world.auditID as the Audit-ID header, which the
// API server adopts as the audit event's ID.
type auditIDTransport struct{ next http.RoundTripper }

func (t auditIDTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if id, _ := world.auditID.Load().(string); id != "" {
		req = req.Clone(req.Context())
		req.Header.Set("Audit-ID", id)
	}
	return t.next.RoundTrip(req)
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	required := os.Getenv("KADMIT_E2E_REQUIRED") == "1"
	dir, err := controlplane.FindBinaries("")
	if err != nil {
		if required || !errors.Is(err, controlplane.ErrBinariesMissing) {
			fmt.Fprintln(os.Stderr, "celdiff:", err)
			return 1
		}
		world.skip = err.Error()
		return m.Run()
	}
	minor, err := apiserverMinor(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "celdiff:", err)
		return 1
	}
	world.minor, world.mapVersion = minor, "v1"
	flags := map[string]string{}
	if minor < 36 {
		// MutatingAdmissionPolicy is beta and off by default before 1.36
		// (KEP-3962: alpha 1.32, beta 1.34, GA 1.36).
		flags["feature-gates"] = "MutatingAdmissionPolicy=true"
		flags["runtime-config"] = "admissionregistration.k8s.io/v1beta1=true"
		world.mapVersion = "v1beta1"
	}
	log, err := os.CreateTemp("", "kadmit-celdiff-controlplane-*.log")
	if err != nil {
		fmt.Fprintln(os.Stderr, "celdiff:", err)
		return 1
	}
	// Audit annotations are observable only in the audit log: every
	// request at level Metadata, written synchronously (blocking mode).
	auditDir, err := os.MkdirTemp("", "kadmit-celdiff-audit-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "celdiff:", err)
		return 1
	}
	defer os.RemoveAll(auditDir)
	auditPolicy := filepath.Join(auditDir, "policy.yaml")
	if err := os.WriteFile(auditPolicy, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n"), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "celdiff:", err)
		return 1
	}
	world.auditLog = filepath.Join(auditDir, "audit.log")
	flags["audit-policy-file"] = auditPolicy
	flags["audit-log-path"] = world.auditLog
	flags["audit-log-format"] = "json"
	flags["audit-log-mode"] = "blocking"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	cp, err := controlplane.Start(ctx, controlplane.Options{Dir: dir, Output: log, APIServerFlags: flags})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "celdiff: %v (log %s)\n", err, log.Name())
		return 1
	}
	defer func() {
		_ = cp.Stop()
		_ = log.Close()
		if os.Getenv("KADMIT_E2E_KEEP") != "1" {
			_ = os.Remove(log.Name())
		} else {
			fmt.Fprintln(os.Stderr, "celdiff: control plane log kept:", log.Name())
		}
	}()
	world.cp = cp
	cfg := rest.CopyConfig(cp.Config)
	cfg.QPS, cfg.Burst = 100, 200
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return auditIDTransport{rt} })
	if world.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "celdiff:", err)
		return 1
	}
	if world.server, err = policysuite.NewServer(cfg, policysuite.ServerOptions{RequestTimeout: 30 * time.Second, ReadyTimeout: effectLimit}); err != nil {
		fmt.Fprintln(os.Stderr, "celdiff:", err)
		return 1
	}
	if err := keepConfigMapParams(world.dyn); err != nil {
		fmt.Fprintln(os.Stderr, "celdiff:", err)
		return 1
	}
	return m.Run()
}

// keepConfigMapParams binds a policy whose paramKind is ConfigMap for the
// whole run, matching nothing. kube-apiserver (v1.37.1 here, and every
// release since the param informers were shared) stops a built-in
// paramKind's informer for good once no binding uses it for one refresh
// tick, and a later policy with that paramKind then sees no params at all
// ("no params found for policy binding", kubernetes/kubernetes#130887,
// #133827; fix in review, #141015). Suites here install and remove
// ConfigMap-param policies one after another, so without this binding the
// second such suite meets the bug, not kadmit's difference.
func keepConfigMapParams(dyn dynamic.Interface) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
		"metadata": map[string]any{"name": "celdiff-keeps-configmap-params"},
		"spec": map[string]any{
			"paramKind": map[string]any{"apiVersion": "v1", "kind": "ConfigMap"},
			"matchConstraints": map[string]any{"resourceRules": []any{map[string]any{
				"apiGroups": []any{"keeper.kadmit.io"}, "apiVersions": []any{"v1"},
				"operations": []any{"CREATE"}, "resources": []any{"nothings"}}}},
			"validations": []any{map[string]any{"expression": "true"}},
		},
	}}
	binding := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
		"metadata": map[string]any{"name": "celdiff-keeps-configmap-params"},
		"spec": map[string]any{
			"policyName":        "celdiff-keeps-configmap-params",
			"validationActions": []any{"Deny"},
			"paramRef":          map[string]any{"selector": map[string]any{}, "parameterNotFoundAction": "Allow"},
		},
	}}
	for _, o := range []struct {
		u        *unstructured.Unstructured
		resource string
	}{{policy, "validatingadmissionpolicies"}, {binding, "validatingadmissionpolicybindings"}} {
		u := o.u
		gvr := schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: o.resource}
		if _, err := dyn.Resource(gvr).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create %s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	return nil
}

var versionRE = regexp.MustCompile(`v1\.(\d+)\.`)

// apiserverMinor runs kube-apiserver --version from dir.
func apiserverMinor(dir string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(dir, controlplane.APIServerBinary), "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("kube-apiserver --version: %w", err)
	}
	m := versionRE.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("kube-apiserver --version: cannot read %q", out)
	}
	return strconv.Atoi(string(m[1]))
}

func requireWorld(t *testing.T) {
	t.Helper()
	if world.skip != "" {
		t.Skip(world.skip)
	}
}
