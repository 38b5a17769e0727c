package seedcluster_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/deploy/realcluster"
	"github.com/kadmit/kadmit/test/deploy/seedcluster"
	"github.com/kadmit/kadmit/test/poll"
)

// Seed 001 (Kueue and LeaderWorkerSet in one namespace): LWS's webhook
// Service selects only control-plane: controller-manager, which Kueue's
// pods carry too, so kube-proxy sends some of the API server's new
// connections for lws-webhook-service to a Kueue pod, which serves a
// certificate for kueue-webhook-service: "x509: certificate is valid for
// kueue-webhook-service..., not lws-webhook-service...", intermittently.
const (
	lwsConfig  = "lws-validating-webhook-configuration"
	lwsWebhook = "vleaderworkerset.kb.io"
	lwsWork    = "lws-work"
)

var lwsGVR = schema.GroupVersionResource{Group: "leaderworkerset.x-k8s.io", Version: "v1", Resource: "leaderworkersets"}

// seed001 is the foreign half of seed 001 on c in namespace ns (kadmit's).
type seed001 struct {
	c      *cluster.Cluster
	ns     string
	dyn    dynamic.Interface
	kueue  seedcluster.Foreign
	lws    seedcluster.Foreign
	ca     *realcluster.CA
	config string
}

// setUpSeed001 installs Kueue (2 replicas, its Service selecting its own
// pods) and LWS (1 replica, its Service selecting control-plane:
// controller-manager only) into ns, the LeaderWorkerSet CRD and LWS's
// validating webhook for it, and waits until both Deployments are Ready
// and the LWS Service has all three pods as endpoints.
func setUpSeed001(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string) *seed001 {
	t.Helper()
	s := &seed001{c: c, ns: ns}
	var err error
	if s.dyn, err = dynamic.NewForConfig(c.Config); err != nil {
		t.Fatal(err)
	}
	// One issuer for both controllers (cert-manager's ClusterIssuer): the
	// chain verifies, the name does not.
	if s.ca, err = realcluster.NewCA("cluster-issuer"); err != nil {
		t.Fatal(err)
	}
	if err := seedcluster.EnsureNamespace(ctx, c.Client, ns, nil); err != nil {
		t.Fatal(err)
	}
	if err := seedcluster.EnsureNamespace(ctx, c.Client, lwsWork, nil); err != nil {
		t.Fatal(err)
	}
	s.kueue = seedcluster.Foreign{Name: "kueue", Namespace: ns, Replicas: 2,
		PodLabels: map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "kueue"}}
	s.lws = seedcluster.Foreign{Name: "lws", Namespace: ns, Replicas: 1,
		PodLabels:       map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "lws"},
		ServiceSelector: map[string]string{"control-plane": "controller-manager"}}
	for _, f := range []seedcluster.Foreign{s.kueue, s.lws} {
		if err := f.Apply(ctx, c.Client, s.ca); err != nil {
			t.Fatal(err)
		}
	}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "leaderworkersets.leaderworkerset.x-k8s.io"},
		"spec": map[string]any{
			"group": "leaderworkerset.x-k8s.io", "scope": "Namespaced",
			"names": map[string]any{"plural": "leaderworkersets", "singular": "leaderworkerset", "kind": "LeaderWorkerSet", "listKind": "LeaderWorkerSetList"},
			"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		},
	}}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := s.dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.config = lwsConfig
	hook := admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: lwsConfig},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         lwsWebhook,
			ClientConfig: serviceRef(s.lws, "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset", s.ca),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{lwsGVR.Group}, APIVersions: []string{lwsGVR.Version}, Resources: []string{lwsGVR.Resource}},
			}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}},
	}
	if _, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &hook, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []seedcluster.Foreign{s.kueue, s.lws} {
		if err := waitReady(ctx, c, ns, f.DeploymentName(), f.Replicas, 90*time.Second); err != nil {
			t.Fatalf("%v\n%s", err, podsDump(c))
		}
	}
	// Every pod carries a port named like the targetPort, so all three
	// are endpoints of lws-webhook-service.
	if err := poll.Until(ctx, 30*time.Second, func(ctx context.Context) error {
		slices, err := c.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + s.lws.ServiceName()})
		if err != nil {
			return err
		}
		ready := 0
		for _, sl := range slices.Items {
			for _, ep := range sl.Endpoints {
				if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					ready++
				}
			}
		}
		if ready != 3 {
			return fmt.Errorf("%s has %d ready endpoints, want 3", s.lws.ServiceName(), ready)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The CRD is served (its discovery is what the dry run needs).
	if err := poll.Until(ctx, 30*time.Second, func(ctx context.Context) error {
		_, err := s.dyn.Resource(lwsGVR).Namespace(lwsWork).List(ctx, metav1.ListOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return s
}

// createLWS dry-run creates a LeaderWorkerSet: one call of the LWS webhook.
func (s *seed001) createLWS(ctx context.Context) error {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
		"metadata": map[string]any{"generateName": "lws-", "namespace": lwsWork},
		"spec":     map[string]any{"replicas": int64(1)},
	}}
	_, err := s.dyn.Resource(lwsGVR).Namespace(lwsWork).Create(ctx, obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

// x509Failure reports whether err is the seed's message.
func (s *seed001) x509Failure(err error) bool {
	return err != nil && strings.Contains(err.Error(), fmt.Sprintf("x509: certificate is valid for %s, not %s", s.kueue.Host(), s.lws.Host()))
}

// seed001Counts are the outcomes of the batches.
type seed001Counts struct {
	Batches                       int
	LWSCalls, LWSOK, LWSX509      int
	LWSOther                      int
	KadmitCalls, KadmitFailed     int
	KadmitBypassed                int
	FirstX509                     string
	OtherErrors, KadmitErrors     []string
	BatchesWithX509, BatchesAllOK int
}

// batches runs n batches, each on new connections from the API server to
// the webhooks, so kube-proxy picks an endpoint again: the API server
// keeps an established connection for as long as it is used, which would
// hide the collision after the first call. Batch restart starts with a
// restarted API server (every connection new, kadmit's included); the
// other batches after the first start with LWS's caBundle rewritten to the
// issuer's CA plus a fresh one (what a CA rotation does): the API server
// builds a new client, and so new connections, for a changed clientConfig.
// Each batch makes per LeaderWorkerSet creations, then per calls of kadmit
// (kadmitCall: true when kadmit admitted and mutated; nil skips).
func (s *seed001) batches(ctx context.Context, t *testing.T, n, per, restart int, kadmitCall func(context.Context) (bool, error)) seed001Counts {
	t.Helper()
	var r seed001Counts
	for b := 0; b < n; b++ {
		switch {
		case b == 0:
		case b == restart:
			began := time.Now()
			if err := s.c.RestartAPIServer(ctx); err != nil {
				t.Fatalf("batch %d: restart API server: %v", b, err)
			}
			t.Logf("batch %d: API server restarted in %s", b, time.Since(began).Round(time.Millisecond))
		default:
			if err := s.rewriteBundle(ctx); err != nil {
				t.Fatalf("batch %d: %v", b, err)
			}
		}
		r.Batches++
		sawX509 := false
		for i := 0; i < per; i++ {
			r.LWSCalls++
			err := s.createLWS(ctx)
			switch {
			case err == nil:
				r.LWSOK++
			case s.x509Failure(err):
				r.LWSX509++
				sawX509 = true
				if r.FirstX509 == "" {
					r.FirstX509 = err.Error()
				}
			default:
				r.LWSOther++
				r.OtherErrors = append(r.OtherErrors, err.Error())
			}
		}
		if sawX509 {
			r.BatchesWithX509++
		} else {
			r.BatchesAllOK++
		}
		if kadmitCall == nil {
			continue
		}
		for i := 0; i < per; i++ {
			r.KadmitCalls++
			mutated, err := kadmitCall(ctx)
			switch {
			case err != nil:
				r.KadmitFailed++
				r.KadmitErrors = append(r.KadmitErrors, err.Error())
			case !mutated:
				r.KadmitBypassed++
			}
		}
	}
	return r
}

// rewriteBundle sets LWS's caBundle to the issuer's CA plus a fresh CA,
// then waits a moment for the API server's informer to see it.
func (s *seed001) rewriteBundle(ctx context.Context) error {
	extra, err := realcluster.NewCA("rotation")
	if err != nil {
		return err
	}
	api := s.c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	cfg, err := api.Get(ctx, lwsConfig, metav1.GetOptions{})
	if err != nil {
		return err
	}
	cfg.Webhooks[0].ClientConfig.CABundle = append(append([]byte{}, s.ca.PEM...), extra.PEM...)
	if _, err := api.Update(ctx, cfg, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("rewrite %s caBundle: %w", lwsConfig, err)
	}
	// The API server's webhook informer sees the change within
	// milliseconds; a call before it still uses the old client, which only
	// makes that batch repeat the previous one's endpoint.
	time.Sleep(time.Second)
	return nil
}

// doctorNamesCollision runs kadmit doctor on LWS's configuration and checks
// it names the collision (KD301: the Service, both Deployments, the fix
// that narrows the selector to LWS's own label) and the certificate that
// does not match (KD405 on Kueue's endpoints).
func (s *seed001) doctorNamesCollision(ctx context.Context, t *testing.T) {
	t.Helper()
	out, _, code := runKadmit(ctx, t, s.c, "doctor", lwsConfig)
	t.Logf("seed 001: kadmit doctor %s (exit %d):\n%s", lwsConfig, code, out)
	if code != 1 {
		t.Errorf("doctor exit %d, want 1 (errors found)", code)
	}
	rep := doctorJSON(ctx, t, s.c, "doctor", lwsConfig)
	w := rep.Webhook(lwsConfig, lwsWebhook)
	if w == nil {
		t.Fatalf("doctor reported no %s/%s", lwsConfig, lwsWebhook)
	}
	col := w.ByID(doctor.IDSelectorCollision)
	if len(col) == 0 {
		t.Fatalf("doctor did not report %s: %+v", doctor.IDSelectorCollision, w.Findings)
	}
	f := col[0]
	if f.Severity != doctor.SeverityError {
		t.Errorf("%s severity %s, want error", f.ID, f.Severity)
	}
	for _, want := range []string{s.ns + "/" + s.lws.ServiceName(), s.kueue.DeploymentName(), s.lws.DeploymentName(), "control-plane=controller-manager"} {
		if !strings.Contains(f.What, want) {
			t.Errorf("%s what %q: want %q", f.ID, f.What, want)
		}
	}
	wantFix := fmt.Sprintf(`kubectl -n %s patch service %s --type=merge -p '{"spec":{"selector":{"app.kubernetes.io/name":"lws"}}}'`, s.ns, s.lws.ServiceName())
	if !strings.Contains(f.Fix, wantFix) {
		t.Errorf("%s fix %q: want %q", f.ID, f.Fix, wantFix)
	}
	// The table an operator reads says the same.
	for _, want := range []string{"KD301", "KD405", s.kueue.DeploymentName(), s.lws.DeploymentName(), wantFix} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor's table output lacks %q", want)
		}
	}
	san := w.ByID(doctor.IDSANMismatch)
	if len(san) != int(s.kueue.Replicas) {
		t.Errorf("%d %s findings, want one per Kueue pod (%d): %+v", len(san), doctor.IDSANMismatch, s.kueue.Replicas, san)
	}
	for _, f := range san {
		if !strings.Contains(f.What, s.kueue.Host()) || !strings.Contains(f.What, s.lws.Host()) {
			t.Errorf("%s what %q: want both %s and %s", f.ID, f.What, s.kueue.Host(), s.lws.Host())
		}
	}
	// kadmit's own webhooks: no error, in particular no collision.
	kr := doctorJSON(ctx, t, s.c, "doctor")
	for _, w := range kr.Webhooks {
		if w.Configuration == lwsConfig {
			continue
		}
		if w.Has(doctor.IDSelectorCollision) || w.Status() == string(doctor.SeverityError) {
			t.Errorf("doctor: %s/%s %s: %+v", w.Configuration, w.Webhook, w.Status(), w.Findings)
		}
	}
}

// watchNamesCollision runs `kadmit watch` (one replica, no election) until
// it records a KD301 Warning Event on LWS's configuration and exports the
// finding as a series, at most 60 s.
func (s *seed001) watchNamesCollision(ctx context.Context, t *testing.T) {
	t.Helper()
	addr, err := kadmitproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(wctx, kadmitBinary(t), "watch", "--kubeconfig", s.c.Kubeconfig, "--leader-elect=false",
		"--metrics-addr", addr, "--handshake-interval", "5s", "--log-format", "text", "--namespace", s.ns)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
		t.Logf("kadmit watch log (last 2000 bytes):\n%s", tailBytes(logs.String(), 2000))
	}()
	var event string
	err = poll.Until(wctx, 60*time.Second, func(ctx context.Context) error {
		evs, err := s.c.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + lwsConfig})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == doctor.IDSelectorCollision && e.Type == "Warning" {
				event = e.Message
				return nil
			}
		}
		return fmt.Errorf("no %s Event on %s yet (%d events)", doctor.IDSelectorCollision, lwsConfig, len(evs.Items))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed 001: kadmit watch Event %s on ValidatingWebhookConfiguration %s (verbatim):\n%s", doctor.IDSelectorCollision, lwsConfig, event)
	for _, want := range []string{"webhook " + lwsWebhook, s.ns + "/" + s.lws.ServiceName(), s.kueue.DeploymentName(), s.lws.DeploymentName(), "fix: kubectl -n " + s.ns + " patch service " + s.lws.ServiceName()} {
		if !strings.Contains(event, want) {
			t.Errorf("watch Event %q: want %q", event, want)
		}
	}
	var series string
	err = poll.Until(wctx, 30*time.Second, func(ctx context.Context) error {
		body, err := httpGet(ctx, "http://"+addr+"/metrics")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, "kadmit_watch_findings{") && strings.Contains(line, `"`+doctor.IDSelectorCollision+`"`) && strings.Contains(line, lwsWebhook) {
				series = line
				return nil
			}
		}
		return fmt.Errorf("no kadmit_watch_findings series for %s on %s", doctor.IDSelectorCollision, lwsWebhook)
	})
	if err != nil {
		t.Error(err)
	}
	t.Logf("seed 001: kadmit watch series: %s", series)
}
