package deploy

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/deploy/internal/proc"
)

// release is one installed release of the chart with its one replica
// running as its ServiceAccount.
type release struct {
	name, full string // release name and the chart's full name
	r          *chart.Rendered
	pod        *corev1.Pod
	p          *proc.Process
	url        string
}

// TestTwoReleasesCoexist installs the chart twice into one namespace on a
// real API server: each release registers webhook configurations of its
// own name, both are called on every pod admission, and `helm uninstall`
// of one (its pre-delete hook, run with the hook's args and ServiceAccount)
// removes exactly its own configurations while the other's keep admitting.
func TestTwoReleasesCoexist(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real API server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	c := startCluster(t, ctx)
	const ns = "shared"
	// Created beforehand, as a platform team would, so neither release owns it.
	if _, err := c.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	root, err := chart.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(c.dir, "kadmit")
	if err := kadmitproc.Build(ctx, root, bin); err != nil {
		t.Fatal(err)
	}
	values := map[string]any{"namespace": map[string]any{"create": false, "name": ns}, "replicas": 1}
	var rels []*release
	for _, name := range []string{"alpha", "beta"} {
		r := render(t, name, ns, values)
		rel := &release{name: name, full: name + "-kadmit", r: r}
		for _, o := range r.Objects {
			if err := c.apply(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		rels = append(rels, rel)
	}
	for _, rel := range rels {
		startRelease(t, ctx, c, rel, bin)
	}
	reg := c.admin.AdmissionregistrationV1()
	registered := func(rel *release) error {
		m, err := reg.MutatingWebhookConfigurations().Get(ctx, rel.full, metav1.GetOptions{})
		if err != nil {
			return err
		}
		v, err := reg.ValidatingWebhookConfigurations().Get(ctx, rel.full, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, u := range []*string{m.Webhooks[0].ClientConfig.URL, v.Webhooks[0].ClientConfig.URL} {
			if u == nil || !strings.HasPrefix(*u, rel.url) {
				return fmt.Errorf("%s calls %v, want %s", rel.full, u, rel.url)
			}
		}
		return nil
	}
	for _, rel := range rels {
		if err := poll(ctx, 60*time.Second, rel.full+" registered", func() error { return registered(rel) }); err != nil {
			t.Fatalf("%v\n%s", err, rel.p.Tail(20))
		}
	}
	if _, err := c.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// admittedBy dry-runs an "offensive" pod under a fresh name until it is
	// denied, and then until each of rels logged its decision on it: the API
	// server called every one of them.
	seq := 0
	admittedBy := func(rels ...*release) error {
		seq++
		name := fmt.Sprintf("offensive-%d", seq)
		return poll(ctx, 60*time.Second, "denied by "+fmt.Sprint(len(rels))+" release(s)", func() error {
			_, err := c.admin.CoreV1().Pods("tenant").Create(ctx, probePod("tenant", name), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err == nil || !strings.Contains(err.Error(), `pod name contains "offensive"`) {
				return fmt.Errorf("pod %s: %v", name, err)
			}
			for _, rel := range rels {
				if !strings.Contains(rel.p.Output(), "tenant/"+name) {
					return fmt.Errorf("%s was not called for tenant/%s", rel.full, name)
				}
			}
			return nil
		})
	}
	if err := admittedBy(rels...); err != nil {
		t.Fatal(err)
	}
	betaBundle := func() string {
		v, err := reg.ValidatingWebhookConfigurations().Get(ctx, "beta-kadmit", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		return string(v.Webhooks[0].ClientConfig.CABundle)
	}
	before := betaBundle()

	// helm uninstall alpha: its pre-delete hook.
	alpha, beta := rels[0], rels[1]
	uninstall(t, ctx, c, alpha, bin)
	time.Sleep(3 * time.Second) // any writer left would have re-created them by now
	for _, get := range []func() error{
		func() error {
			_, err := reg.MutatingWebhookConfigurations().Get(ctx, alpha.full, metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := reg.ValidatingWebhookConfigurations().Get(ctx, alpha.full, metav1.GetOptions{})
			return err
		},
	} {
		if err := get(); !apierrors.IsNotFound(err) {
			t.Errorf("alpha's configuration after its uninstall: %v", err)
		}
	}
	if err := registered(beta); err != nil {
		t.Fatalf("beta's configurations after alpha's uninstall: %v", err)
	}
	if betaBundle() != before {
		t.Error("alpha's uninstall changed beta's caBundle")
	}
	if err := admittedBy(beta); err != nil {
		t.Fatalf("beta stopped admitting after alpha's uninstall: %v", err)
	}
	for _, rel := range rels {
		if out := rel.p.Output(); strings.Contains(strings.ToLower(out), "forbidden") {
			t.Errorf("%s was refused an API call:\n%s", rel.full, grepLines(out, "orbidden"))
		}
	}
}

// startRelease creates the pod of rel's Deployment (standing for its one
// replica) and runs kadmit with the container's args and env as its
// ServiceAccount, called by the API server on loopback (--webhook-url).
func startRelease(t *testing.T, ctx context.Context, c *cluster, rel *release, bin string) {
	t.Helper()
	var dep appsv1.Deployment
	toTyped(t, mustFind(t, rel.r, "Deployment", rel.full), &dep)
	pod := &corev1.Pod{ObjectMeta: *dep.Spec.Template.ObjectMeta.DeepCopy(), Spec: *dep.Spec.Template.Spec.DeepCopy()}
	pod.Name, pod.Namespace = rel.full+"-5c8d7f9b6-x", dep.Namespace
	created, err := c.admin.CoreV1().Pods(dep.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rel.pod = created
	ct := dep.Spec.Template.Spec.Containers[0]
	if !slices.Contains(ct.Args, "--webhook-config-name="+rel.full) {
		t.Fatalf("%s: args %q lack --webhook-config-name=%s", rel.full, ct.Args, rel.full)
	}
	addr, _ := kadmitproc.FreeAddr()
	maddr, _ := kadmitproc.FreeAddr()
	rel.url = "https://" + addr
	kc := c.kubeconfigAs(t, "system:serviceaccount:"+dep.Namespace+":"+rel.full)
	// --metrics-secure=false: proc reads /readyz over plain HTTP, as in
	// TestInstallOnRealAPIServer; secure metrics are exercised by test/e2e/mtls.
	args := append(slices.Clone(ct.Args), "--kubeconfig="+kc, "--addr="+addr, "--metrics-addr="+maddr, "--metrics-secure=false", "--webhook-url="+rel.url)
	p, err := proc.Start(rel.full, bin, args, containerEnv(t, ct, created), addr, maddr, nil)
	if err != nil {
		t.Fatal(err)
	}
	rel.p = p
	t.Cleanup(func() {
		_, _ = p.Terminate(40 * time.Second)
		if t.Failed() {
			t.Logf("%s log tail:\n%s", rel.full, p.Tail(25))
		}
	})
	if err := poll(ctx, 90*time.Second, rel.full+" ready", func() error {
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

// uninstall runs rel's pre-delete hook as Helm would: the hook's objects
// applied, `kadmit uninstall` with the Job's args as the hook's
// ServiceAccount, while this test plays the Deployment controller and the
// kubelet (on scale-to-zero: SIGTERM the replica, delete its pod).
func uninstall(t *testing.T, ctx context.Context, c *cluster, rel *release, bin string) {
	t.Helper()
	var job *unstructured.Unstructured
	for _, h := range rel.r.Hooks {
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
	containers, _, _ := unstructured.NestedSlice(job.Object, "spec", "template", "spec", "containers")
	var args []string
	for _, a := range containers[0].(map[string]any)["args"].([]any) {
		args = append(args, a.(string))
	}
	if !slices.Contains(args, "--configuration-name="+rel.full) {
		t.Fatalf("uninstall args %q do not name %s", args, rel.full)
	}
	hookUser := "system:serviceaccount:" + rel.pod.Namespace + ":" + rel.full + "-uninstall"
	un, err := proc.Start(rel.full+"-uninstall", bin, append(args, "--kubeconfig="+c.kubeconfigAs(t, hookUser)), nil, "", "", nil)
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
			d, err := c.admin.AppsV1().Deployments(rel.pod.Namespace).Get(ctx, rel.full, metav1.GetOptions{})
			if err != nil || *d.Spec.Replicas != 0 {
				return errors.New("not yet")
			}
			return nil
		})
		if code, err := rel.p.Terminate(40 * time.Second); err != nil || code != 0 {
			t.Errorf("%s: exit %d, %v", rel.full, code, err)
		}
		_ = c.admin.CoreV1().Pods(rel.pod.Namespace).Delete(ctx, rel.pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
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
	t.Logf("%s uninstall:\n%s", rel.full, un.Output())
}
