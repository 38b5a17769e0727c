package seedcluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/deploy/realcluster"
	"github.com/kadmit/kadmit/test/deploy/seedcluster"
)

// Seed 000 (Kueue): the webhook configuration is applied with the
// Deployment, before its pod is Ready: every call until then is
// "connect: connection refused" (kube-proxy rejects a ClusterIP without
// ready endpoints).
const (
	kueueNamespace = "kueue-system"
	kueueConfig    = "kueue-mutating-webhook-configuration"
	kueueWebhook   = "mpod.kb.io"
	kueueWork      = "kueue-work"
	// notReadyFor is how long the foreign webhook keeps its port closed
	// and /readyz failing after start (a controller still waiting for its
	// certificate and caches).
	notReadyFor = 20 * time.Second
)

// seed000Foreign reproduces the seed on c and returns the API server's
// first message; it deletes the foreign webhook configuration at the end.
// anyPodReady reports whether Deployment namespace/name has a Ready
// pod.
func anyPodReady(ctx context.Context, c *cluster.Cluster, namespace, name string) bool {
	d, err := c.Client.AppsV1().Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
	return err == nil && d.Status.ReadyReplicas > 0
}

func seed000Foreign(t *testing.T, c *cluster.Cluster) string {
	ctx := ctxFor(t, 3*time.Minute)
	ca, err := realcluster.NewCA("kueue-ca")
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{kueueNamespace, kueueWork} {
		if err := seedcluster.EnsureNamespace(ctx, c.Client, ns, nil); err != nil {
			t.Fatal(err)
		}
	}
	kueue := seedcluster.Foreign{Name: "kueue", Namespace: kueueNamespace, NotReadyFor: notReadyFor,
		PodLabels: map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "kueue"}}
	// `kubectl apply -f manifests.yaml`: the Deployment, the Service and
	// the webhook configuration at once.
	applied := time.Now()
	if err := kueue.Apply(ctx, c.Client, ca); err != nil {
		t.Fatal(err)
	}
	hook := admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: kueueConfig},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:         kueueWebhook,
			ClientConfig: serviceRef(kueue, "/mutate--v1-pod", ca),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			// Only the workload namespace: the seed is about the window
			// before Ready, not about self-interception (seed 004).
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": kueueWork}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}},
	}
	if _, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &hook, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), kueueConfig, metav1.DeleteOptions{})
	})

	// A user creates a pod every 250 ms from the moment the manifests are
	// applied, until one is admitted (bounded: 240 tries, 60 s).
	var (
		first           string
		failed, refused int
		// noRoute counts the failures "connect: no route to host" of the
		// two ends of the window: before the first refused one, a
		// ClusterIP kube-proxy has not programmed yet routes nowhere (once
		// it has, a Service with no ready endpoint is REJECTed:
		// "connection refused"); after it, once the webhook pod is Ready,
		// kube-proxy sends the ClusterIP to the new pod's address, which
		// the node may not have resolved yet (its neighbour entry fails
		// after a few seconds). Seen once in CI, 29 November: 84 refused,
		// then one no route to host as the pod became Ready.
		noRoute         int
		admittedAt      time.Duration
		readyAt         time.Duration
		deadline        = time.Now().Add(time.Minute)
		ready, admitted bool
		tries           int
		others          []string
	)
	for ; tries < 240 && time.Now().Before(deadline) && !admitted; tries++ {
		if !ready && anyPodReady(ctx, c, kueueNamespace, kueue.DeploymentName()) {
			ready, readyAt = true, time.Since(applied)
		}
		p, err := dryRunPod(ctx, c.Client, kueueWork)
		switch {
		case err != nil:
			failed++
			switch {
			case strings.Contains(err.Error(), "connect: connection refused"):
				refused++
				if first == "" {
					first = err.Error()
				}
			case strings.Contains(err.Error(), "connect: no route to host") && (refused == 0 || anyPodReady(ctx, c, kueueNamespace, kueue.DeploymentName())):
				noRoute++
			default:
				others = append(others, err.Error())
			}
		case p.Annotations["foreign.kadmit.test/served-by"] == "kueue":
			admitted, admittedAt = true, time.Since(applied)
		default:
			t.Fatalf("pod admitted without the kueue webhook: %v", p.Annotations)
		}
		if !admitted {
			time.Sleep(250 * time.Millisecond)
		}
	}
	t.Logf("seed 000: API server message (verbatim):\n%s", first)
	t.Logf("seed 000: %d of %d creations failed (%d connection refused, %d no route to host before kube-proxy programmed the Service or as the webhook pod became Ready); webhook pod Ready %.1fs after apply, first admitted pod %.1fs after apply",
		failed, tries, refused, noRoute, readyAt.Seconds(), admittedAt.Seconds())
	if !admitted {
		t.Fatalf("no pod admitted within %d tries\n%s", tries, podsDump(c))
	}
	for _, want := range []string{`failed calling webhook "` + kueueWebhook + `"`, "kueue-webhook-service." + kueueNamespace + ".svc:443", "connect: connection refused"} {
		if !strings.Contains(first, want) {
			t.Errorf("want %q in the API server's message %q", want, first)
		}
	}
	if refused == 0 || refused+noRoute != failed {
		t.Errorf("%d failures, %d of them connection refused (%d no route to host before the first or once the webhook pod was Ready); want every other failure refused, at least one; others: %q", failed, refused, noRoute, others)
	}
	// Not before the pod is Ready: the whole window is the webhook's own.
	if admittedAt < notReadyFor {
		t.Errorf("first pod admitted %.1fs after apply, before the webhook could serve (%s)", admittedAt.Seconds(), notReadyFor)
	}
	if err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, kueueConfig, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	return first
}
