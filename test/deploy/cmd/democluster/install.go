package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/test/deploy/kadmitimage"
	"github.com/kadmit/kadmit/test/deploy/realcluster"
	"github.com/kadmit/kadmit/test/seed"
)

// install runs `helm install kadmit deploy/helm/kadmit` with the Helm SDK
// (realcluster.Install: default values but the image, the one built here,
// never pulled), which waits for the Deployment's pods to be Ready by
// their real probes and both webhook configurations registered; then it
// waits for the API server to call kadmit through its Service.
func (d *demo) install(ctx context.Context) error {
	d.section("Installing kadmit's chart with the Helm SDK (helm install kadmit deploy/helm/kadmit, default values but")
	d.say("--set image.repository=%s,image.tag=%s,image.pullPolicy=Never: no registry here) ...", kadmitimage.Repository, imageTag)
	began := time.Now()
	rel, err := realcluster.Install(ctx, d.c, realcluster.InstallOptions{Tag: imageTag, Timeout: 90 * time.Second})
	if err != nil {
		if rel != nil {
			d.kubectl(ctx, "get", "pods", "-n", rel.Namespace, "-o", "wide")
			d.kubectl(ctx, "get", "events", "-n", rel.Namespace, "--sort-by=.lastTimestamp")
		}
		return err
	}
	d.say("  every replica Ready and both webhook configurations registered %s after helm install (kubelet ran the probes):", time.Since(began).Round(100*time.Millisecond))
	d.kubectl(ctx, "get", "pods", "-n", rel.Namespace, "-o", "wide")

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
		return false, errors.New("admitted without kadmit's toleration (webhooks not in effect yet)")
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
