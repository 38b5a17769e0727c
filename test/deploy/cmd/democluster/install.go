package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/deploy/kadmitimage"
	"github.com/kadmit/kadmit/test/seed"
)

// install runs `helm install kadmit deploy/helm/kadmit` with the Helm SDK,
// default values but the image (the one built here, never pulled), then
// waits for the Deployment's pods to be Ready by their real probes and for
// the API server to call kadmit through its Service.
func (d *demo) install(ctx context.Context) error {
	dir, err := chart.Dir()
	if err != nil {
		return err
	}
	ch, err := loader.LoadDir(dir)
	if err != nil {
		return fmt.Errorf("load chart %s: %w", dir, err)
	}
	kubeconfig := d.c.Kubeconfig
	getter := &genericclioptions.ConfigFlags{KubeConfig: &kubeconfig, Namespace: ptrTo(metav1.NamespaceDefault)}
	cfg := action.NewConfiguration()
	cfg.SetLogger(slog.DiscardHandler)
	// The release record lives in default; the chart creates kadmit-system.
	if err := cfg.Init(getter, metav1.NamespaceDefault, "secret"); err != nil {
		return fmt.Errorf("helm: %w", err)
	}
	inst := action.NewInstall(cfg)
	inst.ReleaseName = chart.ReleaseName
	inst.Namespace = metav1.NamespaceDefault
	// Readiness is waited for below, with what it looks like on the way.
	inst.WaitStrategy = kube.HookOnlyStrategy
	inst.Timeout = 60 * time.Second
	values := map[string]any{"image": map[string]any{
		"repository": kadmitimage.Repository, "tag": imageTag, "pullPolicy": "Never",
	}}
	d.section("Installing kadmit's chart with the Helm SDK (helm install kadmit deploy/helm/kadmit, default values but")
	d.say("--set image.repository=%s,image.tag=%s,image.pullPolicy=Never: no registry here) ...", kadmitimage.Repository, imageTag)
	began := time.Now()
	if _, err := inst.RunWithContext(ctx, ch, values); err != nil {
		return fmt.Errorf("helm install: %w", err)
	}
	d.say("  release installed in %s; waiting for the pods' readiness probes ...", time.Since(began).Round(100*time.Millisecond))
	ns := chart.Namespace
	err = waitFor(ctx, 90*time.Second, func() (bool, error) {
		dep, err := d.c.Client.AppsV1().Deployments(ns).Get(ctx, chart.ReleaseName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		want := int32(1)
		if dep.Spec.Replicas != nil {
			want = *dep.Spec.Replicas
		}
		if dep.Status.ReadyReplicas == want && dep.Status.UpdatedReplicas == want {
			return true, nil
		}
		return false, fmt.Errorf("%d/%d Ready", dep.Status.ReadyReplicas, want)
	})
	if err != nil {
		d.kubectl(ctx, "get", "pods", "-n", ns, "-o", "wide")
		d.kubectl(ctx, "get", "events", "-n", ns, "--sort-by=.lastTimestamp")
		return fmt.Errorf("kadmit's Deployment: %w", err)
	}
	d.say("  every replica Ready %s after helm install (kubelet ran the readiness probes):", time.Since(began).Round(100*time.Millisecond))
	d.kubectl(ctx, "get", "pods", "-n", ns, "-o", "wide")

	// The first admission through kadmit: a server-side dry-run pod that
	// comes back with the lifespan toleration kadmit adds.
	pods := d.c.Client.CoreV1().Pods(metav1.NamespaceDefault)
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "first-admitted"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "kadmit.test/none:1"}}},
	}
	var failures []string
	err = waitFor(ctx, 60*time.Second, func() (bool, error) {
		got, err := pods.Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			failures = append(failures, err.Error())
			return false, err
		}
		for _, t := range got.Spec.Tolerations {
			if t.Key == seed.LifespanKey {
				return true, nil
			}
		}
		return false, errors.New("admitted without kadmit's toleration (webhooks not registered yet)")
	})
	if err != nil {
		return fmt.Errorf("first admission through kadmit: %w", err)
	}
	d.say("  first pod admitted and mutated by kadmit %s after helm install (dry-run creates that failed on the way: %d)", time.Since(began).Round(100*time.Millisecond), len(failures))
	for _, f := range uniq(failures) {
		d.say("    %s", f)
	}
	d.kubectl(ctx, "get", "mutatingwebhookconfigurations,validatingwebhookconfigurations")
	return nil
}

func ptrTo[T any](v T) *T { return &v }

func uniq(list []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range list {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// doctor runs `kadmit doctor --from-error MESSAGE` against the cluster and
// prints its report; it returns the report.
func (d *demo) doctor(ctx context.Context, message string) string {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	d.say("  $ kadmit doctor --from-error '%s'", oneLine(message, 100))
	out, err := runCmd(ctx, d.o.kadmit, "doctor", "--kubeconfig", d.c.Kubeconfig, "--timeout", "45s", "--from-error", message)
	d.say("%s", indent(out, "    "))
	if err != nil {
		// doctor exits non-zero when it has findings: that is its answer.
		d.say("    (exit: %v)", err)
	}
	return out
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
