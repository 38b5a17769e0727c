package cluster_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kadmit/kadmit/test/cluster"
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

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// TestPodsRunAndServicesRoute: a Deployment spread over both nodes becomes
// Ready by its readiness probe, and a ClusterIP Service reaches its pods
// from the control-plane node (where the API server calls webhooks) through
// kube-proxy's rules.
func TestPodsRunAndServicesRoute(t *testing.T) {
	c := startCluster(t, cluster.Options{Nodes: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	labels := map[string]string{"app": "pause"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "pause", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{Name: "pause", Image: cluster.PauseRef, ImagePullPolicy: corev1.PullNever}},
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
						MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.DoNotSchedule,
						LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
					}},
				},
			},
		},
	}
	began := time.Now()
	if _, err := c.Client.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		d, err := c.Client.AppsV1().Deployments("default").Get(ctx, "pause", metav1.GetOptions{})
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
	pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=pause"})
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
}
