package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/cluster/image"
	"github.com/kadmit/kadmit/test/controlplane"
)

func TestMain(m *testing.M) { os.Exit(cluster.Main(m.Run)) }

// startCluster starts a cluster for one test, failing (KADMIT_E2E_REQUIRED=1)
// or skipping when this machine cannot run one.
func startCluster(t *testing.T, opts cluster.Options) *cluster.Cluster {
	t.Helper()
	opts.Log = testWriter{t}
	c, err := cluster.Start(context.Background(), opts)
	if err != nil {
		if (errors.Is(err, cluster.ErrUnavailable) || errors.Is(err, controlplane.ErrBinariesMissing)) && os.Getenv(cluster.EnvRequired) != "1" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestPodsRunAndServicesRoute: a Deployment spread over both nodes becomes
// Ready by its kubelet's readiness probe, and its ClusterIP Service answers,
// on new connections every time, from the control-plane node's network
// namespace (where the API server calls webhooks) through kube-proxy's
// rules; pods on the second node are reached across the bridge.
func TestPodsRunAndServicesRoute(t *testing.T) {
	foreign, err := image.Foreign(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, cluster.Options{Nodes: 2, Images: []string{foreign}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{
						Name: "web", Image: image.ForeignRef, ImagePullPolicy: corev1.PullNever,
						Args:  []string{"--cert-dir", "/tmp", "--name", "web"},
						Ports: []corev1.ContainerPort{{Name: "health", ContainerPort: 8081}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("health")}},
							PeriodSeconds: 1,
						},
					}},
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
						MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.DoNotSchedule,
						LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
					}},
				},
			},
		},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromString("health")}}},
	}
	began := time.Now()
	if _, err := c.Client.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err = c.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		d, err := c.Client.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if d.Status.ReadyReplicas == 2 {
			break
		}
		if err := c.Alive(); err != nil {
			t.Fatal(err)
		}
		if ctx.Err() != nil {
			out, _ := c.Kubectl(context.Background(), "get", "pods", "-A", "-o", "wide")
			t.Fatalf("deployment not Ready: %+v\n%s\n%s", d.Status, out, c.Tail(40))
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("Deployment Ready %s after create", time.Since(began).Round(time.Millisecond))
	pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]bool{}
	for _, p := range pods.Items {
		nodes[p.Spec.NodeName] = true
	}
	if len(nodes) != 2 {
		t.Errorf("pods on %v, want both nodes", nodes)
	}

	// kube-proxy writes the Service's rules within its sync period after the
	// EndpointSlice has both endpoints; then every new connection succeeds.
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	url := fmt.Sprintf("http://%s/readyz", svc.Spec.ClusterIP)
	get := func() error {
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", resp.Status, body)
		}
		return nil
	}
	for get() != nil {
		if ctx.Err() != nil {
			t.Fatalf("Service %s never answered: %v", url, get())
		}
		time.Sleep(200 * time.Millisecond)
	}
	for i := range 40 {
		if err := get(); err != nil {
			t.Fatalf("request %d through the Service: %v", i, err)
		}
	}
}

// TestStopLeavesNothing: after Stop no process the cluster started is left,
// its cgroups, links and work directory are gone, and the host-wide
// sysctls kubelet wants changed are as they were.
func TestStopLeavesNothing(t *testing.T) {
	sysctls := []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops", "vm/panic_on_oom"}
	before := map[string]string{}
	for _, s := range sysctls {
		b, err := os.ReadFile("/proc/sys/" + s)
		if err != nil {
			t.Fatal(err)
		}
		before[s] = string(b)
	}
	c := startCluster(t, cluster.Options{Nodes: 2})
	work := c.WorkDir
	began := time.Now()
	c.Stop()
	t.Logf("stopped in %s", time.Since(began).Round(time.Millisecond))
	if time.Since(began) > 30*time.Second {
		t.Errorf("Stop took %s, want under 30s", time.Since(began))
	}
	for _, s := range sysctls {
		b, _ := os.ReadFile("/proc/sys/" + s)
		if string(b) != before[s] {
			t.Errorf("host sysctl %s changed: %q -> %q", s, before[s], b)
		}
	}
	if os.Getenv(cluster.EnvKeep) != "1" {
		if _, err := os.Stat(work); !os.IsNotExist(err) {
			t.Errorf("work directory %s left behind (%v)", work, err)
		}
	}
	for _, n := range c.Nodes {
		matches, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", fmt.Sprintf("kadmit-test-%d-%s", os.Getpid(), n.Name)))
		if len(matches) > 0 {
			t.Errorf("cgroups left behind: %v", matches)
		}
	}
	out, err := exec.Command("ip", "-o", "link").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"kbr0", "kveth"} {
		if strings.Contains(string(out), l) {
			t.Errorf("link %s left behind:\n%s", l, out)
		}
	}
	// Every process the cluster started had the work directory on its
	// command line (configuration, data dir, kubeconfig).
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), work) {
			t.Errorf("process %s still runs: %s", filepath.Dir(p), strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}
