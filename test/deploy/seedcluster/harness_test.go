package seedcluster_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/cluster/image"
	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/deploy/realcluster"
	"github.com/kadmit/kadmit/test/deploy/seedcluster"
	"github.com/kadmit/kadmit/test/poll"
)

// built holds what the package builds once: the foreign webhook's image
// and the kadmit binary doctor and watch run from (as an operator runs
// them: from a workstation, here the test's network namespace, which is
// node1's, so pod and Service addresses are reachable).
var built struct {
	dir         string
	foreignOnce sync.Once
	foreign     string
	foreignErr  error
	kadmitOnce  sync.Once
	kadmit      string
	kadmitErr   error
	dirOnce     sync.Once
	dirErr      error
}

func buildDir() (string, error) {
	built.dirOnce.Do(func() {
		built.dir, built.dirErr = os.MkdirTemp("", "kadmit-seedcluster-")
	})
	return built.dir, built.dirErr
}

// foreignArchive builds image.Foreign once per test binary.
func foreignArchive(ctx context.Context) (string, error) {
	built.foreignOnce.Do(func() {
		dir, err := buildDir()
		if err != nil {
			built.foreignErr = err
			return
		}
		built.foreign, built.foreignErr = image.Foreign(ctx, dir)
	})
	return built.foreign, built.foreignErr
}

// kadmitBinary builds ./cmd/kadmit of this repository once per test binary.
func kadmitBinary(t *testing.T) string {
	t.Helper()
	built.kadmitOnce.Do(func() {
		dir, err := buildDir()
		if err != nil {
			built.kadmitErr = err
			return
		}
		root, err := chart.RepoRoot()
		if err != nil {
			built.kadmitErr = err
			return
		}
		out := filepath.Join(dir, "kadmit")
		cmd := exec.Command("go", "build", "-o", out, "./cmd/kadmit")
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			built.kadmitErr = fmt.Errorf("go build ./cmd/kadmit: %w\n%s", err, b)
			return
		}
		built.kadmit = out
	})
	if built.kadmitErr != nil {
		t.Fatal(built.kadmitErr)
	}
	return built.kadmit
}

// runKadmit runs the kadmit binary against the cluster's admin kubeconfig
// and returns stdout, stderr and the exit code (bounded by ctx).
func runKadmit(ctx context.Context, t *testing.T, c *cluster.Cluster, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, kadmitBinary(t), append(args, "--kubeconfig", c.Kubeconfig)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return o.String(), e.String(), ee.ExitCode()
	case err != nil:
		t.Fatalf("kadmit %v: %v\n%s", args, err, e.String())
	}
	return o.String(), e.String(), 0
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// ctxFor is a context bounded by d and by the test's deadline.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitReady waits until Deployment ns/name has want ready replicas, all
// of the current template.
func waitReady(ctx context.Context, c *cluster.Cluster, ns, name string, want int32, timeout time.Duration) error {
	return poll.Until(ctx, timeout, func(ctx context.Context) error {
		if err := c.Alive(); err != nil {
			return poll.Stop(err)
		}
		d, err := c.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return deploymentReady(d, want)
	})
}

func deploymentReady(d *appsv1.Deployment, want int32) error {
	s := d.Status
	if s.ObservedGeneration < d.Generation || s.ReadyReplicas != want || s.UpdatedReplicas != want || s.Replicas != want {
		return fmt.Errorf("deployment %s/%s: want %d ready, status %+v", d.Namespace, d.Name, want, s)
	}
	return nil
}

// podsDump is `kubectl get pods -A -o wide` for a failure message.
func podsDump(c *cluster.Cluster) string {
	out, _ := c.Kubectl(context.Background(), "get", "pods,endpointslices", "-A", "-o", "wide")
	return out
}

// serviceRef is a webhook clientConfig for the foreign Service.
func serviceRef(f seedcluster.Foreign, path string, ca *realcluster.CA) admissionregistrationv1.WebhookClientConfig {
	return admissionregistrationv1.WebhookClientConfig{
		Service:  &admissionregistrationv1.ServiceReference{Namespace: f.Namespace, Name: f.ServiceName(), Path: &path},
		CABundle: ca.PEM,
	}
}

// replicaSetEvents returns "reason: message" of every Event about a
// ReplicaSet of Deployment ns/dep.
func replicaSetEvents(ctx context.Context, client kubernetes.Interface, ns, dep string) ([]string, error) {
	evs, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=ReplicaSet"})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range evs.Items {
		if strings.HasPrefix(e.InvolvedObject.Name, dep+"-") {
			out = append(out, e.Reason+": "+e.Message)
		}
	}
	return out, nil
}

// replicaFailure returns the message of the ReplicaFailure condition of
// the newest ReplicaSet of Deployment ns/dep, or "".
func replicaFailure(ctx context.Context, client kubernetes.Interface, ns, dep string) (string, error) {
	rss, err := client.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	for _, rs := range rss.Items {
		if !strings.HasPrefix(rs.Name, dep+"-") {
			continue
		}
		for _, cond := range rs.Status.Conditions {
			if cond.Type == appsv1.ReplicaSetReplicaFailure && cond.Status == corev1.ConditionTrue {
				return cond.Reason + ": " + cond.Message, nil
			}
		}
	}
	return "", nil
}

// dryRunPod creates (server-side dry run: nothing is stored) a pod that
// meets Pod Security "restricted" in ns and returns what admission made
// of it.
func dryRunPod(ctx context.Context, client kubernetes.Interface, ns string) (*corev1.Pod, error) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: ns},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "pause", Image: cluster.PauseRef, ImagePullPolicy: corev1.PullNever,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
	return client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
}

func httpGet(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}

func tailBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
