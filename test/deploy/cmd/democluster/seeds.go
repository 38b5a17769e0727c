package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/deploy/realcluster"
)

// The namespaces of the two field failures.
const (
	ns004     = "demo-004"
	ns001     = "demo-001"
	ns001Apps = "demo-001-apps"
)

var controllerManager = map[string]string{"control-plane": "controller-manager"}

func withName(name string) map[string]string {
	return map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": name}
}

// selfInterception is seed 004 (OpenKruise): a mutating pod webhook with
// failurePolicy Fail whose namespaceSelector matches its own namespace.
// While its pod runs, everything works; once the Deployment is scaled to 0
// nothing serves the webhook, and its ReplicaSet cannot create the pod
// that would: the API server's own FailedCreate message, then doctor.
func (d *demo) selfInterception(ctx context.Context) error {
	d.section("Seed 004: a webhook that intercepts its own namespace blocks its own restart (OpenKruise's \"mpod.kb.io\").")
	if err := d.namespace(ctx, ns004); err != nil {
		return err
	}
	authority, err := realcluster.NewCA("demo-cluster foreign webhooks CA")
	if err != nil {
		return err
	}
	kruise := foreignController{
		Namespace: ns004, Name: "kruise-controller-manager", Service: "kruise-webhook-service", Webhook: "mpod.kb.io",
		Labels: withName("kruise"), Selector: withName("kruise"), WebhookNamespaces: []string{ns004},
	}
	if err := kruise.install(ctx, d, authority); err != nil {
		return err
	}
	// Registered once the pod is Ready, as the controller registers itself
	// when it runs: registered before, its very first pod would be
	// created through it and never start.
	if err := kruise.waitReady(ctx, d); err != nil {
		d.kubectl(ctx, "get", "events", "-n", ns004, "--sort-by=.lastTimestamp")
		return err
	}
	if err := kruise.register(ctx, d, authority); err != nil {
		return err
	}
	d.say("  %s/%s Ready, webhook %q registered for pods in %s (its own namespace), failurePolicy Fail", ns004, kruise.Name, kruise.Webhook, ns004)
	d.say("  scaling it to 0 (an upgrade, an eviction, a node drain would do the same), then back to 1 ...")
	began := time.Now()
	if err := d.scale(ctx, ns004, kruise.Name, 0); err != nil {
		return err
	}
	if err := d.waitNoPods(ctx, ns004, 45*time.Second); err != nil {
		return err
	}
	if err := d.scale(ctx, ns004, kruise.Name, 1); err != nil {
		return err
	}
	msg, err := d.waitFailedCreate(ctx, ns004, "connection refused", 45*time.Second)
	if err != nil {
		d.check(false, "ReplicaSet FailedCreate with connection refused: %v", err)
		d.kubectl(ctx, "get", "events", "-n", ns004, "--sort-by=.lastTimestamp")
	} else {
		d.say("  the ReplicaSet's event %s after scaling to 0, verbatim:", time.Since(began).Round(100*time.Millisecond))
		d.say("    FailedCreate  %s", msg)
		d.check(contains(msg, `failed calling webhook "mpod.kb.io"`, "connection refused"), `the API server's message names "mpod.kb.io" and connection refused`)
		out := d.doctor(ctx, msg)
		d.check(contains(out, "KD501", kruise.Name), "doctor names the self-interception (KD501) and the blocked Deployment")
	}
	// Without this configuration the ReplicaSet creates its pod on its next
	// retry: the deadlock is the configuration, nothing else.
	if err := d.c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, kruise.Name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete mutatingwebhookconfiguration %s: %w", kruise.Name, err)
	}
	return nil
}

// kadmitRestarts is the contrast: kadmit's chart with default values
// excludes kadmit's own namespace, so with no kadmit pod at all its
// ReplicaSet still creates its pods.
func (d *demo) kadmitRestarts(ctx context.Context) error {
	d.section("kadmit cannot get into seed 004: scaled to 0 and back to 3, its pods come back (the chart excludes its own namespace).")
	ns, name := chart.Namespace, chart.ReleaseName
	began := time.Now()
	if err := d.scale(ctx, ns, name, 0); err != nil {
		return err
	}
	if err := d.waitNoPods(ctx, ns, 60*time.Second); err != nil {
		return err
	}
	d.say("  no kadmit pod left after %s (preStop sleep and graceful shutdown); scaling to 3 ...", time.Since(began).Round(100*time.Millisecond))
	up := time.Now()
	if err := d.scale(ctx, ns, name, 3); err != nil {
		return err
	}
	err := waitFor(ctx, 60*time.Second, func() (bool, error) {
		dep, err := d.c.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return dep.Status.ReadyReplicas == 3, fmt.Errorf("%d/3 Ready", dep.Status.ReadyReplicas)
	})
	d.check(err == nil, "3 kadmit pods Ready %s after scaling back (%v)", time.Since(up).Round(100*time.Millisecond), errOr(err, "no FailedCreate"))
	return nil
}

// selectorCollision is seed 001 (LeaderWorkerSet next to Kueue): two
// controllers in one namespace whose pods both carry control-plane:
// controller-manager, each with a webhook Service selecting only that
// label. kube-proxy balances each new connection to lws-webhook-service
// over both pods, and the API server gets Kueue's certificate for LWS's
// name.
func (d *demo) selectorCollision(ctx context.Context) error {
	d.section("Seed 001: two controllers' webhook Services select each other's pods (LeaderWorkerSet next to Kueue).")
	for _, ns := range []string{ns001, ns001Apps} {
		if err := d.namespace(ctx, ns); err != nil {
			return err
		}
	}
	authority, err := realcluster.NewCA("demo-cluster foreign webhooks CA")
	if err != nil {
		return err
	}
	// Only LWS registers a webhook here: Kueue's pod just has to be behind
	// LWS's Service.
	kueue := foreignController{Namespace: ns001, Name: "kueue-controller-manager", Service: "kueue-webhook-service", Labels: withName("kueue"), Selector: controllerManager}
	lws := foreignController{
		Namespace: ns001, Name: "lws-controller-manager", Service: "lws-webhook-service", Webhook: "mpod.lws.x-k8s.io",
		Labels: withName("lws"), Selector: controllerManager, WebhookNamespaces: []string{ns001Apps},
	}
	for _, f := range []foreignController{kueue, lws} {
		if err := f.install(ctx, d, authority); err != nil {
			return err
		}
	}
	for _, f := range []foreignController{kueue, lws} {
		if err := f.waitReady(ctx, d); err != nil {
			return err
		}
		if err := f.register(ctx, d, authority); err != nil {
			return err
		}
	}
	d.say("  both Ready; lws-webhook-service selects %v, which Kueue's pod carries too:", controllerManager)
	d.kubectl(ctx, "get", "endpointslices", "-n", ns001, "-l", "kubernetes.io/service-name=lws-webhook-service")
	// The API server keeps a working connection to a webhook and reuses
	// it: the collision shows only on new connections (a failed handshake
	// closes its connection, a good one is kept). In the field connections
	// end by idling out (~90 s), API server restarts or pod churn; here
	// the API server's connections to the Service's ClusterIP are ended
	// with ss -K (this namespace is node1's, where the API server runs), or
	// when the kernel cannot (no SOCK_DESTROY) by restarting the API server.
	svc, err := d.c.Client.CoreV1().Services(ns001).Get(ctx, lws.Service, metav1.GetOptions{})
	if err != nil {
		return err
	}
	pods := d.c.Client.CoreV1().Pods(ns001Apps)
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "workload"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "kadmit.test/none:1"}}},
	}
	var x509msg string
	calls, failed, rounds, restarts, other := 0, 0, 0, 0, map[string]int{}
	began := time.Now()
	// Each round: new connections, then calls until one is admitted (that
	// connection would be reused from then on). One chance in two per new
	// connection; twelve rounds miss all with odds of 1 in 4096.
	for round := 0; round < 12 && x509msg == ""; round++ {
		rounds++
		if out, err := runCmd(ctx, "ss", "-K", "dst", svc.Spec.ClusterIP, "dport", "=", ":443"); err != nil {
			if restarts == 0 {
				d.say("  (ss -K: %v %s; restarting the API server instead)", err, strings.TrimSpace(out))
			}
			if err := d.c.RestartAPIServer(ctx); err != nil {
				return err
			}
			restarts++
		}
		// The transport notices the ended connection on its read loop.
		time.Sleep(200 * time.Millisecond)
		for range 6 {
			calls++
			_, err := pods.Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err == nil {
				break
			}
			if strings.Contains(err.Error(), "x509") {
				failed++
				if x509msg == "" {
					x509msg = err.Error()
				}
				continue
			}
			other[err.Error()]++
		}
	}
	d.say("  %d dry-run pod creates in %s over %d rounds of fresh connections (%s): %d failed with x509, %d other errors",
		calls, ns001Apps, rounds, time.Since(began).Round(100*time.Millisecond), failed, sum(other))
	for _, m := range slices.Sorted(maps.Keys(other)) {
		d.say("    %dx %s", other[m], m)
	}
	if x509msg == "" {
		d.check(false, "a call to lws-webhook-service reached Kueue's pod (x509) in %d calls", calls)
		return nil
	}
	d.say("  the API server's answer, verbatim:\n    %s", x509msg)
	d.check(contains(x509msg, `failed calling webhook "mpod.lws.x-k8s.io"`, "x509: certificate is valid for kueue-webhook-service.demo-001.svc", "not lws-webhook-service.demo-001.svc"),
		"Kueue's certificate answered for LWS's Service name")
	out := d.doctor(ctx, x509msg)
	d.check(contains(out, "KD301", "kueue-controller-manager"), "doctor names the selector collision (KD301) and Kueue's Deployment")
	return nil
}

func (d *demo) scale(ctx context.Context, ns, name string, replicas int32) error {
	s := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: autoscalingv1.ScaleSpec{Replicas: replicas}}
	if _, err := d.c.Client.AppsV1().Deployments(ns).UpdateScale(ctx, name, s, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("scale %s/%s to %d: %w", ns, name, replicas, err)
	}
	return nil
}

func (d *demo) waitNoPods(ctx context.Context, ns string, limit time.Duration) error {
	err := waitFor(ctx, limit, func() (bool, error) {
		list, err := d.c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return len(list.Items) == 0, fmt.Errorf("%d pods left", len(list.Items))
	})
	if err != nil {
		return fmt.Errorf("pods in %s: %w", ns, err)
	}
	return nil
}

// waitFailedCreate waits for a FailedCreate event in ns whose message
// contains want and returns that message.
func (d *demo) waitFailedCreate(ctx context.Context, ns, want string, limit time.Duration) (string, error) {
	var found string
	err := waitFor(ctx, limit, func() (bool, error) {
		list, err := d.c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=FailedCreate"})
		if err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if strings.Contains(e.Message, want) {
				found = e.Message
				return true, nil
			}
		}
		return false, fmt.Errorf("%d FailedCreate events, none with %q", len(list.Items), want)
	})
	return found, err
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
