package seedcluster_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/deploy/realcluster"
	"github.com/kadmit/kadmit/test/deploy/seedcluster"
	"github.com/kadmit/kadmit/test/poll"
)

// Seed 004 (OpenKruise): the webhook's namespaceSelector skips namespaces
// labelled control-plane, the namespace was created beforehand without
// that label, so the Fail webhook intercepts its own pods. Once they are
// gone (scaled to 0 and back), the ReplicaSet cannot create them:
// FailedCreate ... failed calling webhook "mpod.kb.io" ... connection
// refused.
const (
	kruiseNamespace = "kruise-system"
	kruiseConfig    = "kruise-mutating-webhook-configuration"
	kruiseWebhook   = "mpod.kb.io"
)

// seed004Foreign reproduces the seed on c and returns the API server's
// message; it leaves the fix applied and the foreign webhook deleted.
func seed004Foreign(t *testing.T, c *cluster.Cluster) string {
	ctx := ctxFor(t, 3*time.Minute)
	ca, err := realcluster.NewCA("kruise-ca")
	if err != nil {
		t.Fatal(err)
	}
	if err := seedcluster.EnsureNamespace(ctx, c.Client, kruiseNamespace, nil); err != nil {
		t.Fatal(err)
	}
	kruise := seedcluster.Foreign{Name: "kruise", Namespace: kruiseNamespace, Service: "kruise-webhook-service",
		PodLabels: map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "kruise"}}
	if err := kruise.Apply(ctx, c.Client, ca); err != nil {
		t.Fatal(err)
	}
	if err := waitReady(ctx, c, kruiseNamespace, kruise.DeploymentName(), 1, time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, podsDump(c))
	}
	// OpenKruise's chart: every pod CREATE, Fail, namespaces without the
	// control-plane label (which its chart puts on kruise-system when it
	// creates it).
	hook := admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: kruiseConfig},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:         kruiseWebhook,
			ClientConfig: serviceRef(kruise, "/mutate-pod", ca),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "control-plane", Operator: metav1.LabelSelectorOpDoesNotExist},
			}},
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
		_ = c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), kruiseConfig, metav1.DeleteOptions{})
	})
	// The webhook works while its pod runs: a pod in its own namespace
	// goes through it (the annotation it adds).
	if err := poll.Until(ctx, 30*time.Second, func(ctx context.Context) error {
		p, err := dryRunPod(ctx, c.Client, kruiseNamespace)
		if err != nil {
			return err
		}
		if p.Annotations["foreign.kadmit.test/served-by"] != "kruise" {
			return errString("pod not mutated by kruise yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Its pods are deleted: scale to 0, wait until none is left, back to 1.
	if err := kruise.Scale(ctx, c.Client, 0); err != nil {
		t.Fatal(err)
	}
	if err := poll.Until(ctx, time.Minute, func(ctx context.Context) error {
		pods, err := c.Client.CoreV1().Pods(kruiseNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=kruise"})
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return errString("kruise pods still there")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	scaledUp := time.Now()
	if err := kruise.Scale(ctx, c.Client, 1); err != nil {
		t.Fatal(err)
	}
	var event, condition string
	if err := poll.Until(ctx, time.Minute, func(ctx context.Context) error {
		evs, err := replicaSetEvents(ctx, c.Client, kruiseNamespace, kruise.DeploymentName())
		if err != nil {
			return err
		}
		for _, e := range evs {
			if strings.HasPrefix(e, "FailedCreate: ") && event == "" {
				event = e
			}
		}
		if condition == "" {
			if condition, err = replicaFailure(ctx, c.Client, kruiseNamespace, kruise.DeploymentName()); err != nil {
				return err
			}
		}
		if event == "" || condition == "" {
			return errString("no FailedCreate event and ReplicaFailure condition yet")
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, podsDump(c))
	}
	t.Logf("seed 004: ReplicaSet event %.1fs after scaling back to 1 (verbatim):\n%s", time.Since(scaledUp).Seconds(), event)
	t.Logf("seed 004: ReplicaSet ReplicaFailure condition (verbatim):\n%s", condition)
	for _, s := range []string{event, condition} {
		for _, want := range []string{`failed calling webhook "` + kruiseWebhook + `"`, "kruise-webhook-service." + kruiseNamespace + ".svc:443/mutate-pod"} {
			if !strings.Contains(s, want) {
				t.Errorf("want %q in %q", want, s)
			}
		}
		// The seed's "connection refused" is kube-proxy rejecting a
		// Service without endpoints; while its rules still lag the last
		// pod's removal (a loaded node), the dial goes to the gone pod's
		// address and fails "no route to host" instead. Both are the
		// same outage, and doctor --from-error explains both (below).
		if !strings.Contains(s, "connect: connection refused") && !strings.Contains(s, "connect: no route to host") {
			t.Errorf("want \"connect: connection refused\" (or, kube-proxy lagging, \"connect: no route to host\") in %q", s)
		}
	}

	// doctor names the self-interception and the fix, and leads with it
	// when given the event's message.
	out, _, code := runKadmit(ctx, t, c, "doctor", kruiseConfig)
	t.Logf("seed 004: kadmit doctor %s (exit %d):\n%s", kruiseConfig, code, out)
	if code != 1 {
		t.Errorf("doctor exit %d, want 1 (errors found)", code)
	}
	for _, want := range []string{"KD501", "kubectl label namespace " + kruiseNamespace + " control-plane="} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor's table output lacks %q", want)
		}
	}
	rep := doctorJSON(ctx, t, c, "doctor", kruiseConfig)
	w := rep.Webhook(kruiseConfig, kruiseWebhook)
	if w == nil {
		t.Fatalf("doctor reported no %s/%s", kruiseConfig, kruiseWebhook)
	}
	self := w.ByID(doctor.IDSelfInterception)
	if len(self) == 0 {
		t.Fatalf("doctor did not report %s on %s: %+v", doctor.IDSelfInterception, kruiseWebhook, w.Findings)
	}
	f := self[0]
	if f.Severity != doctor.SeverityError {
		t.Errorf("%s severity %s, want error", f.ID, f.Severity)
	}
	for _, want := range []string{kruiseNamespace, "control-plane"} {
		if !strings.Contains(f.What, want) {
			t.Errorf("%s what %q: want %q", f.ID, f.What, want)
		}
	}
	if !strings.Contains(f.Fix, "kubectl label namespace "+kruiseNamespace+" control-plane=") && !strings.Contains(f.Fix, "kubectl label ns "+kruiseNamespace+" control-plane=") {
		t.Errorf("%s fix %q: want the namespace labelled control-plane=... (the seed's fix)", f.ID, f.Fix)
	}
	msg := strings.TrimPrefix(event, "FailedCreate: ")
	out, _, code = runKadmit(ctx, t, c, "doctor", "--from-error", msg)
	t.Logf("seed 004: kadmit doctor --from-error <the event> (exit %d):\n%s", code, out)
	fr := doctorJSON(ctx, t, c, "doctor", "--from-error", msg)
	if fr.FromError == nil {
		t.Errorf("doctor --from-error matched nothing")
	}
	if lead := leadFinding(fr); lead == nil || lead.ID != doctor.IDSelfInterception && lead.ID != doctor.IDNoReadyEndpoints {
		t.Errorf("doctor --from-error leads with %+v, want %s (or %s)", lead, doctor.IDSelfInterception, doctor.IDNoReadyEndpoints)
	}

	// The fix works: with the namespace labelled, the ReplicaSet creates
	// the pod on its next retry.
	if _, err := c.Kubectl(ctx, "label", "namespace", kruiseNamespace, "control-plane=openkruise"); err != nil {
		t.Fatal(err)
	}
	fixed := time.Now()
	if err := waitReady(ctx, c, kruiseNamespace, kruise.DeploymentName(), 1, 90*time.Second); err != nil {
		t.Errorf("after the fix: %v", err)
	}
	t.Logf("seed 004: with the namespace labelled, the ReplicaSet's pod Ready %.1fs later", time.Since(fixed).Seconds())
	if err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, kruiseConfig, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	return event
}

func leadFinding(r *doctor.Report) *doctor.Finding {
	for _, w := range r.Webhooks {
		for i := range w.Findings {
			if w.Findings[i].Lead && w.Findings[i].ID != doctor.IDFromError {
				return &w.Findings[i]
			}
		}
	}
	return nil
}

// doctorJSON runs kadmit doctor with -o json and decodes the report.
func doctorJSON(ctx context.Context, t *testing.T, c *cluster.Cluster, args ...string) *doctor.Report {
	t.Helper()
	out, stderr, code := runKadmit(ctx, t, c, append(args, "-o", "json")...)
	if code == 2 {
		t.Fatalf("kadmit %v: exit 2\n%s\n%s", args, out, stderr)
	}
	var rep doctor.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("kadmit %v -o json: %v\n%s", args, err, out)
	}
	return &rep
}

type errString string

func (e errString) Error() string { return string(e) }
