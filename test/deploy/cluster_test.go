package deploy

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/kadmit/kadmit/test/controlplane"
	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/deploy/internal/audit"
	"github.com/kadmit/kadmit/test/deploy/internal/proc"
	testpoll "github.com/kadmit/kadmit/test/poll"
)

// cluster is the real kube-apiserver (RBAC and Pod Security admission on,
// as in every v1.37 API server) with an audit log of every request.
type cluster struct {
	cp       *controlplane.ControlPlane
	admin    kubernetes.Interface
	dyn      dynamic.Interface
	mapper   meta.RESTMapper
	auditLog string
	dir      string

	mu       sync.Mutex
	warnings []string
}

func (c *cluster) HandleWarningHeader(code int, agent, text string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.warnings = append(c.warnings, text)
}

func (c *cluster) takeWarnings() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.warnings
	c.warnings = nil
	return w
}

func startCluster(t *testing.T, ctx context.Context) *cluster {
	t.Helper()
	dir, err := controlplane.FindBinaries("")
	if err != nil {
		if errors.Is(err, controlplane.ErrBinariesMissing) && os.Getenv("KADMIT_E2E_REQUIRED") != "1" {
			t.Skipf("no control plane binaries (make controlplane): %v", err)
		}
		t.Fatal(err)
	}
	work := t.TempDir()
	// Metadata for every request: enough to know who called what verb on
	// which object, and whether RBAC allowed it.
	policy := filepath.Join(work, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &cluster{auditLog: filepath.Join(work, "audit.log"), dir: work}
	var out *os.File
	if os.Getenv("KADMIT_DEPLOY_TEST_VERBOSE") != "" {
		out = os.Stderr
	}
	opts := controlplane.Options{Dir: dir, APIServerFlags: map[string]string{
		"audit-policy-file": policy, "audit-log-path": c.auditLog, "audit-log-format": "json",
		// blocking: an event is on disk before the response, so reading the
		// log after the calls sees all of them
		"audit-log-mode": "blocking",
	}}
	if out != nil {
		opts.Output = out
	}
	if c.cp, err = controlplane.Start(ctx, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.cp.Stop() })
	cfg := rest.CopyConfig(c.cp.Config)
	cfg.WarningHandler = c
	c.admin = kubernetes.NewForConfigOrDie(cfg)
	c.dyn = dynamic.NewForConfigOrDie(cfg)
	c.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cfg)))
	return c
}

// apply server-side applies obj as Helm 4 does (field manager, forced).
func (c *cluster) apply(ctx context.Context, obj *unstructured.Unstructured) error {
	gvk := obj.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		c.mapper.(*restmapper.DeferredDiscoveryRESTMapper).Reset()
		if m, err = c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			return fmt.Errorf("%s: %w", gvk, err)
		}
	}
	var ri dynamic.ResourceInterface = c.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = c.dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
	}
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	force := true
	_, err = ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "helm", Force: &force})
	if err != nil {
		return fmt.Errorf("apply %s %s/%s: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// kubeconfigAs writes a kubeconfig that authenticates as the admin and
// impersonates user: every request is authorized as user, so kadmit gets
// exactly the ServiceAccount's RBAC and nothing else.
func (c *cluster) kubeconfigAs(t *testing.T, user string) string {
	t.Helper()
	raw, err := c.cp.Kubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.Load(raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		ai.Impersonate = user
	}
	path := filepath.Join(c.dir, strings.NewReplacer(":", "_").Replace(user)+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func (c *cluster) clientAs(user string) kubernetes.Interface {
	cfg := rest.CopyConfig(c.cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	return kubernetes.NewForConfigOrDie(cfg)
}

// poll waits until f returns nil (test/poll), for at most timeout; the
// error names what was awaited and f's last error.
func poll(ctx context.Context, timeout time.Duration, what string, f func() error) error {
	if err := testpoll.Until(ctx, timeout, func(context.Context) error { return f() }); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func toTyped(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		t.Fatalf("convert %s/%s: %v", u.GetKind(), u.GetName(), err)
	}
}

// containerEnv resolves the container's env as the kubelet would for pod:
// literal values, and the downward API fields the chart uses.
func containerEnv(t *testing.T, c corev1.Container, pod *corev1.Pod) []string {
	t.Helper()
	var env []string
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env = append(env, e.Name+"="+pod.Name)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			env = append(env, e.Name+"="+pod.Namespace)
		default:
			t.Fatalf("env %s: source %+v not emulated by this test", e.Name, e.ValueFrom)
		}
	}
	return env
}

func secretPEM(t *testing.T, s *corev1.Secret, key string) []*x509.Certificate {
	t.Helper()
	out, err := webhookcerts.ParseCertificates(s.Data[key])
	if err != nil {
		t.Fatalf("secret %s: %v", key, err)
	}
	return out
}

// TestInstallOnRealAPIServer is the proof: the rendered chart is
// applied to a real API server, Pod Security admission accepts kadmit's pod
// template under "restricted", three kadmit replicas run with the rendered
// args and env and only the rendered ServiceAccount's permissions, and
// bootstrap, leader election, rotation, registration, admission and
// uninstall all work; the audit log then shows every call was allowed and
// every granted verb was used.
func TestInstallOnRealAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real API server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	c := startCluster(t, ctx)
	t.Logf("control plane up in %s", time.Since(start).Round(time.Millisecond))
	ns := chart.Namespace
	saUser := "system:serviceaccount:" + ns + ":kadmit"
	hookUser := "system:serviceaccount:" + ns + ":kadmit-uninstall"

	r, err := chart.Render(chart.ReleaseName, ns, nil)
	if err != nil {
		t.Fatal(err)
	}

	// 1. Install: every object server-side applied, real validation, and
	// not a single warning (Pod Security "warn" would flag the Deployment's
	// pod template here if it were not restricted).
	for _, o := range r.Objects {
		if err := c.apply(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if w := c.takeWarnings(); len(w) > 0 {
		t.Fatalf("API server warnings while applying the chart: %q", w)
	}
	nsObj, err := c.admin.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"kadmit.io/ignore": "true", "pod-security.kubernetes.io/enforce": "restricted", "kubernetes.io/metadata.name": ns} {
		if nsObj.Labels[k] != v {
			t.Errorf("namespace label %s=%q, want %q", k, nsObj.Labels[k], v)
		}
	}
	dep, err := c.admin.AppsV1().Deployments(ns).Get(ctx, "kadmit", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *dep.Spec.Replicas != 3 || dep.Spec.Template.Spec.Containers[0].Lifecycle.PreStop.Sleep.Seconds != 10 {
		t.Errorf("stored Deployment lost settings: replicas %d", *dep.Spec.Replicas)
	}
	svc, err := c.admin.CoreV1().Services(ns).Get(ctx, "kadmit", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := dep.Spec.Selector.MatchLabels; !mapsEqual(svc.Spec.Selector, want) {
		t.Errorf("Service selector %v, want the Deployment's %v", svc.Spec.Selector, want)
	}

	// 2. Pod Security admission enforces restricted in the namespace: a
	// privileged pod is refused, pods from the Deployment's template pass.
	// They stand for the Deployment's replicas (no controller manager runs
	// here); the kadmit processes below take their names.
	bad := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "privileged", Namespace: ns}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "c", Image: "busybox", SecurityContext: &corev1.SecurityContext{Privileged: ptr(true)}}}}}
	if _, err := c.admin.CoreV1().Pods(ns).Create(ctx, bad, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "violates PodSecurity") {
		t.Fatalf("privileged pod in %s: err = %v, want a PodSecurity restricted violation", ns, err)
	}
	var pods []*corev1.Pod
	for i := range 3 {
		p := &corev1.Pod{ObjectMeta: *dep.Spec.Template.ObjectMeta.DeepCopy(), Spec: *dep.Spec.Template.Spec.DeepCopy()}
		p.Name, p.Namespace = fmt.Sprintf("kadmit-7d9f8c6b5-%c", 'a'+i), ns
		created, err := c.admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("pod from the Deployment's template refused: %v", err)
		}
		pods = append(pods, created)
	}
	if w := c.takeWarnings(); len(w) > 0 {
		t.Fatalf("warnings creating kadmit's pods: %q", w)
	}

	root, err := chart.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(c.dir, "kadmit")
	if err := kadmitproc.Build(ctx, root, bin); err != nil {
		t.Fatal(err)
	}
	saKubeconfig := c.kubeconfigAs(t, saUser)
	container := dep.Spec.Template.Spec.Containers[0]
	if container.Args[0] != "serve" {
		t.Fatalf("container args %q", container.Args)
	}

	// replicas runs one kadmit per pod with the container's exact args and
	// env. Appended, because every replica shares this host's network:
	// --kubeconfig (in a pod: the ServiceAccount token; here: the
	// impersonating kubeconfig) and distinct loopback --addr/--metrics-addr
	// (pflag takes the last value).
	replicas := func(t *testing.T, firstAddr string, extra ...string) []*proc.Process {
		t.Helper()
		var ps []*proc.Process
		for i, pod := range pods {
			addr, _ := kadmitproc.FreeAddr()
			if i == 0 && firstAddr != "" {
				addr = firstAddr
			}
			maddr, _ := kadmitproc.FreeAddr()
			// --metrics-secure=false: proc reads /readyz and /metrics over
			// plain HTTP; the secure listener is covered by test/e2e/mtls.
			args := append(slices.Clone(container.Args), "--kubeconfig="+saKubeconfig, "--addr="+addr, "--metrics-addr="+maddr, "--metrics-secure=false")
			args = append(args, extra...)
			p, err := proc.Start(pod.Name, bin, args, containerEnv(t, container, pod), addr, maddr, nil)
			if err != nil {
				t.Fatal(err)
			}
			ps = append(ps, p)
		}
		t.Cleanup(func() {
			for _, p := range ps {
				_, _ = p.Terminate(40 * time.Second)
				if t.Failed() {
					t.Logf("%s log tail:\n%s", p.Name, p.Tail(25))
				}
			}
		})
		return ps
	}
	waitReady := func(t *testing.T, ps []*proc.Process) {
		t.Helper()
		for _, p := range ps {
			if err := poll(ctx, 90*time.Second, p.Name+" ready", func() error {
				select {
				case <-p.Exited():
					return fmt.Errorf("exited %d:\n%s", p.ExitCode(), p.Tail(20))
				default:
				}
				return p.Ready(ctx)
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	stopAll := func(t *testing.T, ps []*proc.Process) {
		t.Helper()
		for _, p := range ps {
			code, err := p.Terminate(40 * time.Second)
			if err != nil || code != 0 {
				t.Errorf("%s: exit %d, %v\n%s", p.Name, code, err, p.Tail(20))
			}
		}
	}
	noForbidden := func(t *testing.T, ps []*proc.Process) {
		t.Helper()
		for _, p := range ps {
			if out := p.Output(); strings.Contains(strings.ToLower(out), "forbidden") {
				t.Errorf("%s was refused an API call:\n%s", p.Name, grepLines(out, "orbidden"))
			}
		}
	}
	secrets := c.admin.CoreV1().Secrets(ns)

	// 3. Service mode, exactly the rendered command line: bootstrap (one
	// Secret, whichever replica creates it: no Lease), readiness and a
	// forced serving rotation. Every replica probes the Service's endpoints
	// before registering; with no endpoints here (no EndpointSlice
	// controller) they must hold registration back.
	t.Run("service mode: bootstrap, serving rotation", func(t *testing.T) {
		ps := replicas(t, "")
		waitReady(t, ps)
		s, err := secrets.Get(ctx, "kadmit-tls", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := poll(ctx, 30*time.Second, "every replica holds registration back", func() error {
			for _, p := range ps {
				if !strings.Contains(p.Output(), "no ready endpoint of the Service") {
					return fmt.Errorf("no 'no ready endpoint' log line from %s yet", p.Name)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("registered without a reachable endpoint: %v", err)
		}
		old := secretPEM(t, s, "tls.crt")[0]
		if _, err := secrets.Patch(ctx, "kadmit-tls", types.MergePatchType, []byte(`{"metadata":{"annotations":{"kadmit.io/rotate":"serving"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		var fresh *x509.Certificate
		if err := poll(ctx, 60*time.Second, "serving certificate re-issued", func() error {
			s, err := secrets.Get(ctx, "kadmit-tls", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if _, still := s.Annotations["kadmit.io/rotate"]; still {
				return errors.New("rotate annotation still set")
			}
			if fresh = secretPEM(t, s, "tls.crt")[0]; fresh.Equal(old) {
				return errors.New("tls.crt unchanged")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if err := poll(ctx, 30*time.Second, p.Name+" serves the new certificate", func() error {
				leaf, err := p.ServedLeaf(ctx, "kadmit.kadmit-system.svc")
				if err != nil {
					return err
				}
				if !leaf.Equal(fresh) {
					return fmt.Errorf("serves serial %x", leaf.SerialNumber)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		noForbidden(t, ps)
		stopAll(t, ps)
	})
	if t.Failed() {
		return
	}

	// 4. The same plus --webhook-url: without a Service-routed network (the
	// routed e2e suite builds that), the API server reaches kadmit on
	// loopback. Registration, admission, and a full CA rotation.
	var phaseB []*proc.Process
	t.Run("registration, admission, CA rotation", func(t *testing.T) {
		// the API server calls the first replica; every replica registers
		// the same URL, whichever leads
		addr, _ := kadmitproc.FreeAddr()
		url := "https://" + addr
		ps := replicas(t, addr, "--webhook-url="+url)
		waitReady(t, ps)
		reg := c.admin.AdmissionregistrationV1()
		if err := poll(ctx, 60*time.Second, "configurations registered", func() error {
			m, err := reg.MutatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if _, err := reg.ValidatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{}); err != nil {
				return err
			}
			if u := m.Webhooks[0].ClientConfig.URL; u == nil || !strings.HasPrefix(*u, url) {
				return fmt.Errorf("url %v", u)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		admits := func() error {
			pod := probePod("tenant", "kadmit-probe-offensive")
			_, err := c.admin.CoreV1().Pods("tenant").Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err == nil || !strings.Contains(err.Error(), `pod name contains "offensive"`) {
				return fmt.Errorf("offensive pod: %v", err)
			}
			got, err := c.admin.CoreV1().Pods("tenant").Create(ctx, probePod("tenant", "web"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(got.Spec.Tolerations, func(t corev1.Toleration) bool { return t.Key == "acme.com/lifespan-remaining" }) {
				return errors.New("no lifespan toleration")
			}
			return nil
		}
		if err := poll(ctx, 60*time.Second, "webhooks in effect", admits); err != nil {
			t.Fatal(err)
		}
		// kadmit's own namespace is never intercepted, even once it lost
		// the exclusion label (a namespace created beforehand): an
		// "offensive" pod from the template is admitted there.
		if _, err := c.admin.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(`{"metadata":{"labels":{"kadmit.io/ignore":null}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		self := &corev1.Pod{ObjectMeta: *dep.Spec.Template.ObjectMeta.DeepCopy(), Spec: *dep.Spec.Template.Spec.DeepCopy()}
		self.Name, self.Namespace = "kadmit-offensive-selftest", ns
		if _, err := c.admin.CoreV1().Pods(ns).Create(ctx, self, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Fatalf("kadmit intercepted its own namespace: %v", err)
		}

		s, err := secrets.Get(ctx, "kadmit-tls", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		oldCA := secretPEM(t, s, "ca.crt")[0]
		if _, err := secrets.Patch(ctx, "kadmit-tls", types.MergePatchType, []byte(`{"metadata":{"annotations":{"kadmit.io/rotate":"ca"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := poll(ctx, 120*time.Second, "CA rotation complete", func() error {
			s, err := secrets.Get(ctx, "kadmit-tls", metav1.GetOptions{})
			if err != nil {
				return err
			}
			cas := secretPEM(t, s, "ca.crt")
			if len(cas) != 1 || cas[0].Equal(oldCA) {
				return fmt.Errorf("ca.crt holds %d CAs, new=%v", len(cas), len(cas) > 0 && !cas[0].Equal(oldCA))
			}
			m, err := reg.MutatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if string(m.Webhooks[0].ClientConfig.CABundle) != string(s.Data["ca.crt"]) {
				return errors.New("caBundle not yet the new CA alone")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := poll(ctx, 30*time.Second, "admission after CA rotation", admits); err != nil {
			t.Fatal(err)
		}
		checkMetricNames(t, ctx, c, ps)
		noForbidden(t, ps)
		phaseB = ps
	})
	if t.Failed() {
		return
	}

	// 5. Uninstall as the pre-delete hook runs it: the hook's objects
	// applied, `kadmit uninstall` with the Job's args as the hook's
	// ServiceAccount. This test plays the Deployment controller and kubelet:
	// once the Deployment is scaled to 0 it stops the replicas (SIGTERM)
	// and deletes their pods.
	t.Run("uninstall leaves no webhook configuration", func(t *testing.T) {
		var job *unstructured.Unstructured
		for _, h := range r.Hooks {
			if h.GetKind() == "Job" {
				job = h
				continue
			}
			if err := c.apply(ctx, h); err != nil {
				t.Fatal(err)
			}
		}
		if job == nil {
			t.Fatal("no uninstall Job rendered")
		}
		jobArgs, _, _ := unstructured.NestedSlice(job.Object, "spec", "template", "spec", "containers")
		var args []string
		for _, a := range jobArgs[0].(map[string]any)["args"].([]any) {
			args = append(args, a.(string))
		}
		// The uninstall starts first; this goroutine then plays the
		// Deployment controller and kubelet until the scale-down is seen
		// (or the uninstall gave up, leaving nothing to play).
		un, err := proc.Start("uninstall", bin, append(args, "--kubeconfig="+c.kubeconfigAs(t, hookUser)), nil, "", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			_ = poll(ctx, 2*time.Minute, "scaled to zero", func() error {
				select {
				case <-un.Exited():
					return nil
				default:
				}
				d, err := c.admin.AppsV1().Deployments(ns).Get(ctx, "kadmit", metav1.GetOptions{})
				if err != nil || *d.Spec.Replicas != 0 {
					return errors.New("not yet")
				}
				return nil
			})
			for i, p := range phaseB {
				code, err := p.Terminate(40 * time.Second)
				if err != nil || code != 0 {
					t.Errorf("%s: exit %d, %v", p.Name, code, err)
				}
				_ = c.admin.CoreV1().Pods(ns).Delete(ctx, pods[i].Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
			}
		}()
		select {
		case <-un.Exited():
		case <-time.After(3 * time.Minute):
			_, _ = un.Terminate(5 * time.Second)
		}
		<-stopped
		if un.ExitCode() != 0 {
			t.Fatalf("kadmit uninstall exit %d:\n%s", un.ExitCode(), un.Output())
		}
		t.Logf("kadmit uninstall:\n%s", un.Output())
		// Gone, and still gone once any replica would have re-applied.
		time.Sleep(3 * time.Second)
		reg := c.admin.AdmissionregistrationV1()
		if _, err := reg.MutatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("MutatingWebhookConfiguration after uninstall: %v", err)
		}
		if _, err := reg.ValidatingWebhookConfigurations().Get(ctx, "kadmit", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("ValidatingWebhookConfiguration after uninstall: %v", err)
		}
		// With nothing registered, an offensive pod is admitted again.
		if _, err := c.admin.CoreV1().Pods("tenant").Create(ctx, probePod("tenant", "after-offensive"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Errorf("pod refused after uninstall: %v", err)
		}
		rbacMatches(t, c, hookUser, "kadmit-uninstall", r.Hooks, nil)
	})

	// 6. Policies that read cluster state, enabled through the chart's
	// config: the conditional ClusterRole must be enough for their
	// informers. The CRDs they read are installed first (as kueue and the
	// scheduler-plugins would); the rendered --config path is the
	// ConfigMap's volume mount, emulated by a file with its content.
	cr := render(t, chart.ReleaseName, ns, clusterPolicies)
	t.Run("cluster-reading policies with the conditional ClusterRole", func(t *testing.T) {
		for _, crd := range []string{localQueueCRD, elasticQuotaCRD} {
			objs, err := chart.Decode(crd)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.apply(ctx, objs[0]); err != nil {
				t.Fatal(err)
			}
		}
		if err := poll(ctx, 30*time.Second, "CRDs served", func() error {
			for _, gv := range []string{"kueue.x-k8s.io/v1beta1", "scheduling.sigs.k8s.io/v1alpha1"} {
				if _, err := c.admin.Discovery().ServerResourcesForGroupVersion(gv); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for _, o := range cr.Objects {
			if k := o.GetKind(); k == "ClusterRole" || k == "ClusterRoleBinding" || k == "Role" || k == "RoleBinding" || k == "ConfigMap" {
				if err := c.apply(ctx, o); err != nil {
					t.Fatal(err)
				}
			}
		}
		var d appsv1.Deployment
		toTyped(t, mustFind(t, cr, "Deployment", "kadmit"), &d)
		cm := mustFind(t, cr, "ConfigMap", "kadmit-config")
		data, _, _ := unstructured.NestedString(cm.Object, "data", "config.yaml")
		cfgFile := filepath.Join(c.dir, "config.yaml")
		if err := os.WriteFile(cfgFile, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		ct := d.Spec.Template.Spec.Containers[0]
		var args []string
		for _, a := range ct.Args {
			if a == "--config=/etc/kadmit/config/config.yaml" {
				a = "--config=" + cfgFile
			}
			args = append(args, a)
		}
		addr, _ := kadmitproc.FreeAddr()
		maddr, _ := kadmitproc.FreeAddr()
		args = append(args, "--kubeconfig="+saKubeconfig, "--addr="+addr, "--metrics-addr="+maddr, "--metrics-secure=false", "--webhook-url=https://"+addr)
		p, err := proc.Start(pods[0].Name, bin, args, containerEnv(t, ct, pods[0]), addr, maddr, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if code, err := p.Terminate(40 * time.Second); err != nil || code != 0 {
				t.Errorf("exit %d, %v\n%s", code, err, p.Tail(20))
			}
		}()
		waitReady(t, []*proc.Process{p})
		noForbidden(t, []*proc.Process{p})
	})

	// 7. The chart's Role and ClusterRole against what kadmit actually did.
	t.Run("RBAC grants exactly the calls kadmit makes", func(t *testing.T) {
		// client-go's informers list through a streaming watch
		// (sendInitialEvents) on API servers that support it, as v1.37
		// does, and fall back to a plain list elsewhere: the list grants
		// stay, and are proven here to work by name and only by name.
		sa := c.clientAs(saUser)
		lists := []struct {
			what string
			list func(metav1.ListOptions) error
			name string
		}{
			{"secrets", func(o metav1.ListOptions) error {
				_, err := sa.CoreV1().Secrets(ns).List(ctx, o)
				return err
			}, "kadmit-tls"},
			{"mutatingwebhookconfigurations", func(o metav1.ListOptions) error {
				_, err := sa.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, o)
				return err
			}, "kadmit"},
			{"validatingwebhookconfigurations", func(o metav1.ListOptions) error {
				_, err := sa.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, o)
				return err
			}, "kadmit"},
		}
		fallback := map[string]string{
			// The replicas here serve metrics over plain HTTP (proc reads them
			// so); TokenReview and SubjectAccessReview for --metrics-secure
			// are exercised against the real API server by test/e2e/mtls.
			"create tokenreviews/":         "secure metrics, exercised by test/e2e/mtls",
			"create subjectaccessreviews/": "secure metrics, exercised by test/e2e/mtls",
			// Every policy stays on here; turning the last one of a type
			// off deletes its configuration, exercised against a real API
			// server by test/e2e/unregister.
			"delete mutatingwebhookconfigurations/kadmit":   "deleting a configuration whose last hook is off, exercised by test/e2e/unregister",
			"delete validatingwebhookconfigurations/kadmit": "deleting a configuration whose last hook is off, exercised by test/e2e/unregister",
			// Only a caBundle fight with another field manager makes the
			// registrar write an Event, exercised by test/e2e's
			// TestCABundleFightBacksOff.
			"create events/": "the registrar's CABundleContested Event, exercised by test/e2e TestCABundleFightBacksOff",
			"patch events/":  "a repeated CABundleContested Event, exercised by test/e2e TestCABundleFightBacksOff",
		}
		for _, l := range lists {
			if err := l.list(metav1.ListOptions{FieldSelector: "metadata.name=" + l.name}); err != nil {
				t.Errorf("list %s with fieldSelector metadata.name=%s as the ServiceAccount: %v", l.what, l.name, err)
			}
			if err := l.list(metav1.ListOptions{}); !apierrors.IsForbidden(err) {
				t.Errorf("list all %s as the ServiceAccount: err = %v, want Forbidden (resourceNames must restrict it)", l.what, err)
			}
			fallback["list "+l.what+"/"+l.name] = "informer list fallback without streaming lists; list by name allowed, unnamed list forbidden (checked above)"
		}
		// The cluster-reading informers list the same way; their grants are
		// unnamed, so the ServiceAccount's plain lists must simply work.
		saCfg := rest.CopyConfig(c.cp.Config)
		saCfg.Impersonate = rest.ImpersonationConfig{UserName: saUser}
		saDyn := dynamic.NewForConfigOrDie(saCfg)
		for _, gvr := range []schema.GroupVersionResource{
			{Version: "v1", Resource: "pods"}, {Version: "v1", Resource: "namespaces"},
			{Group: "kueue.x-k8s.io", Version: "v1beta1", Resource: "localqueues"},
			{Group: "scheduling.sigs.k8s.io", Version: "v1alpha1", Resource: "elasticquotas"},
		} {
			if _, err := saDyn.Resource(gvr).List(ctx, metav1.ListOptions{}); err != nil {
				t.Errorf("list %s as the ServiceAccount: %v", gvr.Resource, err)
			}
			fallback["list "+gvr.Resource+"/"] = "informer list fallback without streaming lists; the list is allowed (checked above)"
		}
		var roles []*unstructured.Unstructured
		roles = append(roles, r.Objects...)
		if reads := cr.Find("ClusterRole", ns+":kadmit-cluster-reads"); reads != nil {
			roles = append(roles, reads, mustFind(t, cr, "ClusterRoleBinding", ns+":kadmit-cluster-reads"))
		}
		rbacMatches(t, c, saUser, "kadmit", roles, fallback)
	})
}

// auditedCalls returns the API calls user made with agent, from c's audit
// log, logging them (and the non-resource requests) for the reader; it
// fails t when the log cannot be read or holds none.
func auditedCalls(t *testing.T, c *cluster, user, agent string) []audit.Call {
	t.Helper()
	calls, nonResource, err := audit.Calls(c.auditLog, user, agent)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) == 0 {
		t.Fatalf("no audited calls by %s", user)
	}
	var lines []string
	for _, cl := range calls {
		lines = append(lines, "  "+cl.String())
	}
	t.Logf("%s made these calls:\n%s\nand non-resource requests %q", user, strings.Join(lines, "\n"), nonResource)
	return calls
}

// rbacMatches compares user's calls in the audit log with what the
// RoleBindings and ClusterRoleBindings among objs grant user through the
// Roles and ClusterRoles among objs (bindings → roles, as RBAC authorizes):
// every call allowed and granted, every grant used.
//
// fallback lists grants kadmit's calls may leave unused, each with the
// reason; the caller proves them some other way.
func rbacMatches(t *testing.T, c *cluster, user, agent string, objs []*unstructured.Unstructured, fallback map[string]string) {
	t.Helper()
	grants, err := audit.BoundGrants(user, objs...)
	if err != nil {
		t.Fatal(err)
	}
	if len(grants) == 0 {
		t.Fatalf("no binding among the objects grants %s anything", user)
	}
	calls := auditedCalls(t, c, user, agent)
	uncovered, unused := audit.Compare(calls, grants)
	for _, u := range uncovered {
		t.Errorf("%s: call not granted by the chart (or forbidden): %s", user, u)
	}
	for _, g := range unused {
		key := g.Verb + " " + g.Resource + "/" + g.Name
		if why, ok := fallback[key]; ok {
			t.Logf("%s: %s unused in this run: %s", user, g, why)
			delete(fallback, key)
			continue
		}
		t.Errorf("%s: the chart grants %s, which kadmit never used", user, g)
	}
	for k := range fallback {
		t.Errorf("%s: expected %s to be granted but unused; the chart or kadmit changed", user, k)
	}
}

var metricName = regexp.MustCompile(`\b(kadmit_[a-z_]+|apiserver_admission_webhook_[a-z_]+)\b`)

// checkMetricNames: every kadmit_* and apiserver_admission_webhook_* metric
// the alerts and the dashboard query exists on the running kadmit replicas
// or on the real API server, so no alert watches a name nobody exports.
func checkMetricNames(t *testing.T, ctx context.Context, c *cluster, ps []*proc.Process) {
	t.Helper()
	exprs, err := monitoringExprs()
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, e := range exprs {
		for _, m := range metricName.FindAllString(e, -1) {
			used[m] = true
		}
	}
	var exposed strings.Builder
	for _, p := range ps {
		m, err := p.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		exposed.WriteString(m)
	}
	raw, err := c.admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	exposed.Write(raw)
	root, err := chart.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var source strings.Builder
	for _, f := range []string{"metrics.go", "certificates.go", "config.go"} {
		b, err := os.ReadFile(filepath.Join(root, "internal", "metrics", f))
		if err != nil {
			t.Fatal(err)
		}
		source.Write(b)
	}
	for m := range used {
		if strings.HasPrefix(m, "kadmit_watch_") {
			// kadmit watch's series: TestWatchRulesAndDashboard checks
			// them against internal/watch, TestWatchRBACOnRealAPIServer
			// against a running watch.
			continue
		}
		if regexp.MustCompile(`(?m)^` + m + `[{ ]`).MatchString(exposed.String()) {
			continue
		}
		// A labelled family is exported only once a sample exists: a
		// panic, or (on the API server) a fail-open call, never happened
		// here. Those must at least be kadmit's registered names.
		if strings.HasPrefix(m, "kadmit_") && strings.Contains(source.String(), `Name: "`+m+`"`) {
			t.Logf("%s: registered by kadmit, no sample yet", m)
			continue
		}
		if m == "apiserver_admission_webhook_fail_open_count" {
			t.Logf("%s: exported by the API server only after a failurePolicy Ignore webhook failed", m)
			continue
		}
		t.Errorf("alerts or dashboard query %s, which neither kadmit nor the API server exposes", m)
	}
	t.Logf("metric names checked: %d", len(used))
}

// monitoringExprs returns every PromQL expression of the generated rules
// file and dashboard.
func monitoringExprs() ([]string, error) {
	files, err := chart.Generated()
	if err != nil {
		return nil, err
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Expr string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(files["deploy/prometheus/kadmit-rules.yaml"], &rules); err != nil {
		return nil, err
	}
	var dash struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(files["deploy/dashboards/kadmit.json"], &dash); err != nil {
		return nil, err
	}
	var out []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out = append(out, r.Expr)
		}
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no expressions found")
	}
	return out, nil
}

const localQueueCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: localqueues.kueue.x-k8s.io}
spec:
  group: kueue.x-k8s.io
  scope: Namespaced
  names: {plural: localqueues, singular: localqueue, kind: LocalQueue}
  versions:
  - name: v1beta1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
`

const elasticQuotaCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: elasticquotas.scheduling.sigs.k8s.io
  # *.k8s.io groups need this; scheduler-plugins' CRD carries the same
  annotations: {api-approved.kubernetes.io: "https://github.com/kubernetes-sigs/scheduler-plugins/pull/52"}
spec:
  group: scheduling.sigs.k8s.io
  scope: Namespaced
  names: {plural: elasticquotas, singular: elasticquota, kind: ElasticQuota}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
`

func probePod(ns, name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func ptr[T any](v T) *T { return &v }

func ptrVal(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
