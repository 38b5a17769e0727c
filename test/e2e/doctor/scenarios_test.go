package doctor

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
	"github.com/kadmit/kadmit/test/netns"
	"github.com/kadmit/kadmit/test/poll"
)

// runPlugin runs `kubectl kadmit <args>` (kubectl finds kubectl-kadmit on
// PATH) and returns stdout and the exit code. The plugin dials endpoints
// itself, unguarded: callers name only configurations whose endpoints are in
// 198.18.0.0/15 inside the private namespace, where nothing else is routable.
func runPlugin(t *testing.T, e *env, args ...string) (string, int) {
	t.Helper()
	kubectl := kubectlPath(t)
	cmd := exec.CommandContext(e2eenv.TestCtx(t, 3*time.Minute), kubectl, append([]string{"kadmit"}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(e.Command("kubectl-kadmit"))+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+e.Kubeconfig)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return out.String() + stderr.String(), ee.ExitCode()
	case err != nil:
		t.Fatalf("kubectl kadmit %v: %v\n%s", args, err, stderr.String())
	}
	return out.String() + stderr.String(), 0
}

// TestKueueConnectionRefused: the Service and a ready endpoint exist, but
// nothing listens there (the webhook pod reported ready too early). Check 2
// and the probe must agree on "connection refused".
func TestKueueConnectionRefused(t *testing.T) {
	e := routedWorld(t)
	sys := namespace(t, e, "kueue-system", nil)
	work := namespace(t, e, "kueue-work", nil)
	labels := map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "kueue"}
	pods := workload(t, e, sys, "kueue-controller-manager", labels, 1)
	service(t, e, sys, "kueue-webhook-service", labels)
	ip := nextIP(t)
	if err := netns.AddLoopbackAddr(ip); err != nil { // on lo, nothing listening: RST
		t.Fatal(err)
	}
	endpointSlice(t, e, sys, "kueue-webhook-service", ep{IP: ip, Pod: pods[0], Ready: true})
	const config, name = "kueue-validating-webhook-configuration", "vpod.kb.io"
	validating(t, e, config, hook{Name: name, Service: svcRef(sys, "kueue-webhook-service"), CABundle: newCA(t).pem(), Fail: true, NamespaceSelector: onlyNamespaces(work)})
	waitCalled(t, e, work, name)

	rep := runDoctor(t, e, doctor.Options{Names: []string{config}, Probe: true, ProbeCount: 2})
	w := hookReport(t, rep, config, name)
	refused := need(t, rep, w, doctor.IDEndpointRefused, doctor.SeverityError)[0]
	if refused.Endpoint != net.JoinHostPort(ip, "9443") {
		t.Errorf("%s endpoint = %q; want %s:9443", doctor.IDEndpointRefused, refused.Endpoint, ip)
	}
	contains(t, "KD202 why", refused.Why, "connection refused", "failurePolicy is Fail")
	probe := need(t, rep, w, doctor.IDProbeRefused, doctor.SeverityError)[0]
	contains(t, "KD702 why", probe.Why, "connect: connection refused", ip)
	contains(t, "KD702 what", probe.What, "connection refused in 2 of 2")
	need(t, rep, w, doctor.IDSingleReplica, doctor.SeverityWarning)
	need(t, rep, w, doctor.IDNoPodDisruptionBudget, doctor.SeverityWarning)
	if w.Has(doctor.IDSelectorCollision) || w.Has(doctor.IDNoReadyEndpoints) {
		t.Errorf("unexpected collision or no-endpoint finding:\n%s", render(rep))
	}
}

// TestNoReadyEndpoints: the only endpoint is not ready, so the API server
// has nowhere to send the call.
func TestNoReadyEndpoints(t *testing.T) {
	e := routedWorld(t)
	sys := namespace(t, e, "starting-system", nil)
	work := namespace(t, e, "starting-work", nil)
	labels := map[string]string{"app.kubernetes.io/name": "starting"}
	pods := workload(t, e, sys, "starting-webhook", labels, 1)
	service(t, e, sys, "starting-webhook", labels)
	endpointSlice(t, e, sys, "starting-webhook", ep{IP: nextIP(t), Pod: pods[0], Ready: false})
	const config, name = "starting", "vpod.starting.io"
	validating(t, e, config, hook{Name: name, Service: svcRef(sys, "starting-webhook"), CABundle: newCA(t).pem(), Fail: true, NamespaceSelector: onlyNamespaces(work)})
	waitCalled(t, e, work, name)

	rep := runDoctor(t, e, doctor.Options{Names: []string{config}, Probe: true})
	w := hookReport(t, rep, config, name)
	f := need(t, rep, w, doctor.IDNoReadyEndpoints, doctor.SeverityError)[0]
	contains(t, "KD201 what", f.What, "1 endpoint(s) are all not ready")
	contains(t, "KD201 why", f.Why, "outage", "CREATE pods")
	contains(t, "KD201 fix", f.Fix, "kubectl -n "+sys+" get pods -l app.kubernetes.io/name=starting")
	need(t, rep, w, doctor.IDProbeNoEndpoints, doctor.SeverityError)
}

// TestLeaderWorkerSetSelectorCollision recreates LeaderWorkerSet #528 /
// Kueue #5192: lws-webhook-service selects only control-plane:
// controller-manager, which the Kueue manager's pod carries too, so calls
// randomly reach Kueue's pod, whose certificate is valid only for
// kueue-webhook-service.<ns>.svc.
func TestLeaderWorkerSetSelectorCollision(t *testing.T) {
	e := routedWorld(t)
	sys := namespace(t, e, "lws-system", nil)
	work := namespace(t, e, "lws-work", nil)
	lwsLabels := map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "lws"}
	kueueLabels := map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "kueue"}
	lwsPods := workload(t, e, sys, "lws-controller-manager", lwsLabels, 1)
	kueuePods := workload(t, e, sys, "kueue-controller-manager", kueueLabels, 1)
	service(t, e, sys, "lws-webhook-service", map[string]string{"control-plane": "controller-manager"})
	service(t, e, sys, "kueue-webhook-service", kueueLabels)
	lwsCA, kueueCA := newCA(t), newCA(t)
	lwsIP, kueueIP := nextIP(t), nextIP(t)
	webhookServer(t, lwsIP, lwsCA.serving(t, svcNames(sys, "lws-webhook-service"), time.Now(), 24*time.Hour), 0)
	webhookServer(t, kueueIP, kueueCA.serving(t, svcNames(sys, "kueue-webhook-service"), time.Now(), 24*time.Hour), 0)
	endpointSlice(t, e, sys, "lws-webhook-service", ep{IP: lwsIP, Pod: lwsPods[0], Ready: true}, ep{IP: kueueIP, Pod: kueuePods[0], Ready: true})
	endpointSlice(t, e, sys, "kueue-webhook-service", ep{IP: kueueIP, Pod: kueuePods[0], Ready: true})
	const config, name = "lws-validating-webhook-configuration", "vleaderworkerset.kb.io"
	validating(t, e, config, hook{Name: name, Service: svcRef(sys, "lws-webhook-service"), CABundle: lwsCA.pem(), Fail: true, NamespaceSelector: onlyNamespaces(work)})
	waitCalled(t, e, work, name) // returns on the first call that lands on Kueue's pod

	// Each probe lands on either pod with probability 1/2; a round of 12
	// sees both answers except with probability 2^-11. Up to 3 rounds.
	var rep *doctor.Report
	var w *doctor.WebhookReport
	for round := 0; round < 3; round++ {
		rep = runDoctor(t, e, doctor.Options{Names: []string{config}, Probe: true, ProbeCount: 12})
		w = hookReport(t, rep, config, name)
		if w.Has(doctor.IDProbeSANMismatch) && w.Has(doctor.IDProbeAdmitted) {
			break
		}
	}
	t.Logf("doctor's report:\n%s", render(rep))

	col := need(t, rep, w, doctor.IDSelectorCollision, doctor.SeverityError)[0]
	contains(t, "KD301 what", col.What, "Deployment/lws-controller-manager", "Deployment/kueue-controller-manager",
		lwsPods[0], kueuePods[0], lwsIP, kueueIP, `"control-plane=controller-manager"`)
	contains(t, "KD301 fix", col.Fix, "kubectl -n "+sys+" patch service lws-webhook-service --type=merge",
		`{"spec":{"selector":{"app.kubernetes.io/name":"lws"}}}`)
	san := need(t, rep, w, doctor.IDSANMismatch, doctor.SeverityError)
	if len(san) != 1 || san[0].Endpoint != net.JoinHostPort(kueueIP, "9443") {
		t.Errorf("SAN mismatch findings = %+v; want exactly one, for Kueue's endpoint %s:9443", san, kueueIP)
	}
	contains(t, "KD405 what", san[0].What, "not valid for lws-webhook-service."+sys+".svc", "kueue-webhook-service."+sys+".svc")
	probe := need(t, rep, w, doctor.IDProbeSANMismatch, doctor.SeverityError)[0]
	contains(t, "KD704", probe.What+probe.Why, "Intermittent", "x509: certificate is valid for", "not lws-webhook-service."+sys+".svc")
	if !w.Has(doctor.IDProbeAdmitted) {
		t.Errorf("no admitted probe in 3x12 calls: the intermittency is not shown:\n%s", render(rep))
	}

	// The same through the kubectl plugin: exit 1, the table names KD301.
	out, code := runPlugin(t, e, "doctor", config, "--probe", "--probe-count", "6")
	if code != 1 {
		t.Errorf("kubectl kadmit doctor exit = %d; want 1 (errors found)\n%s", code, out)
	}
	contains(t, "kubectl kadmit doctor output", out, "ERROR", name, doctor.IDSelectorCollision, doctor.IDSANMismatch)
	if path := os.Getenv("KADMIT_DOCTOR_LWS_OUT"); path != "" {
		_ = os.WriteFile(path, []byte(out), 0o644)
	}
}

// TestOpenKruiseBootstrapDeadlock recreates OpenKruise #1521: the namespace
// lacks the label the webhook's namespaceSelector excludes, so the Fail pod
// webhook intercepts the creation of its own pods, which can never start.
func TestOpenKruiseBootstrapDeadlock(t *testing.T) {
	e := world(t)
	sys := namespace(t, e, "kruise-system", nil)
	labels := map[string]string{"control-plane": "controller-manager"}
	workload(t, e, sys, "kruise-controller-manager", labels, 0) // its pods cannot be created
	service(t, e, sys, "kruise-webhook-service", labels)
	const config, name = "kruise-mutating-webhook-configuration", "mpod.kb.io"
	mutating(t, e, config, hook{Name: name, Service: svcRef(sys, "kruise-webhook-service"), CABundle: newCA(t).pem(), Fail: true,
		NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "control-plane", Operator: metav1.LabelSelectorOpDoesNotExist},
			// Keeps the webhook away from the other tests' namespaces.
			{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: []string{sys}},
		}}})
	if e.Routed {
		// The deadlock itself: creating the controller's pod fails.
		waitCalled(t, e, sys, name)
	}

	rep := runDoctor(t, e, doctor.Options{Names: []string{config}})
	w := hookReport(t, rep, config, name)
	f := need(t, rep, w, doctor.IDSelfInterception, doctor.SeverityError)[0]
	contains(t, "KD501 what", f.What, "new pods of Deployment/kruise-controller-manager in "+sys, "CREATE pods")
	wantFix := "kubectl label namespace " + sys + " control-plane=controller-manager --overwrite"
	if !strings.HasPrefix(f.Fix, wantFix) {
		t.Fatalf("KD501 fix = %q; want it to start with %q", f.Fix, wantFix)
	}
	need(t, rep, w, doctor.IDNoReadyEndpoints, doctor.SeverityError)

	// Apply the fix exactly as printed (its "# ..." tail is a shell comment).
	cmd := exec.CommandContext(e2eenv.TestCtx(t, apiTimeout), "sh", "-c", f.Fix)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.Kubeconfig,
		"PATH="+filepath.Dir(kubectlPath(t))+string(os.PathListSeparator)+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("running the fix %q: %v\n%s", f.Fix, err, out)
	}
	rep = runDoctor(t, e, doctor.Options{Names: []string{config}})
	if w := hookReport(t, rep, config, name); w.Has(doctor.IDSelfInterception) {
		t.Errorf("after the fix, %s is still reported:\n%s", doctor.IDSelfInterception, render(rep))
	}
	if !e.Routed {
		return
	}
	// And the API server agrees: the controller's pod is admitted now.
	if err := poll.Until(t.Context(), webhookTakeEffect, func(ctx context.Context) error {
		_, err := e.Client.CoreV1().Pods(sys).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "kruise-controller-manager-", Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "example.com/kruise"}}},
		}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}); err != nil {
		t.Fatalf("after the fix the controller's pod is still rejected: %v", err)
	}
}

// TestCertificateScenarios: caBundle from another CA (unknown authority), an
// expired serving certificate, and a webhook that sleeps past its timeout.
func TestCertificateScenarios(t *testing.T) {
	e := routedWorld(t)
	cases := []struct {
		name    string
		cert    func(t *testing.T, good *ca, ns, svc string) tls.Certificate
		bundle  func(good *ca) []byte
		delay   time.Duration
		timeout int32
		// endpointID is the per-endpoint finding, "" for none; probeID the
		// probe's classification.
		endpointID, probeID, probeText string
	}{
		{name: "other-ca",
			cert: func(t *testing.T, good *ca, ns, svc string) tls.Certificate {
				return good.serving(t, svcNames(ns, svc), time.Now(), time.Hour)
			},
			bundle:     func(*ca) []byte { return newCA(t).pem() },
			endpointID: doctor.IDUnknownAuthority, probeID: doctor.IDProbeUnknownAuthority, probeText: "x509: certificate signed by unknown authority"},
		{name: "expired",
			cert: func(t *testing.T, good *ca, ns, svc string) tls.Certificate {
				return good.serving(t, svcNames(ns, svc), time.Now().Add(-3*time.Hour), time.Hour)
			},
			bundle:     func(good *ca) []byte { return good.pem() },
			endpointID: doctor.IDServingCertExpiry, probeID: doctor.IDProbeCertExpired, probeText: "certificate has expired or is not yet valid"},
		{name: "slow",
			cert: func(t *testing.T, good *ca, ns, svc string) tls.Certificate {
				return good.serving(t, svcNames(ns, svc), time.Now(), time.Hour)
			},
			bundle:  func(good *ca) []byte { return good.pem() },
			delay:   4 * time.Second,
			timeout: 1,
			probeID: doctor.IDProbeTimeout, probeText: "context deadline exceeded"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sys := namespace(t, e, c.name+"-system", nil)
			work := namespace(t, e, c.name+"-work", nil)
			labels := map[string]string{"app.kubernetes.io/name": c.name}
			pods := workload(t, e, sys, c.name+"-webhook", labels, 1)
			svc := c.name + "-webhook"
			service(t, e, sys, svc, labels)
			good := newCA(t)
			ip := nextIP(t)
			webhookServer(t, ip, c.cert(t, good, sys, svc), c.delay)
			endpointSlice(t, e, sys, svc, ep{IP: ip, Pod: pods[0], Ready: true})
			config, name := c.name, "vpod."+c.name+".example.com"
			validating(t, e, config, hook{Name: name, Service: svcRef(sys, svc), CABundle: c.bundle(good), Fail: true,
				TimeoutSeconds: c.timeout, NamespaceSelector: onlyNamespaces(work)})
			waitCalled(t, e, work, name)

			rep := runDoctor(t, e, doctor.Options{Names: []string{config}, Probe: true})
			w := hookReport(t, rep, config, name)
			if c.endpointID != "" {
				f := need(t, rep, w, c.endpointID, doctor.SeverityError)[0]
				if f.Endpoint != net.JoinHostPort(ip, "9443") {
					t.Errorf("%s endpoint = %q; want %s:9443", c.endpointID, f.Endpoint, ip)
				}
			} else {
				for _, f := range w.Findings {
					if strings.HasPrefix(f.ID, "KD4") {
						t.Errorf("slow but valid webhook got certificate finding %s", f)
					}
				}
			}
			p := need(t, rep, w, c.probeID, doctor.SeverityError)[0]
			contains(t, c.probeID+" why", p.Why, c.probeText)
		})
	}
}

// TestServiceAndSettingsChecks: check 1 (Service, port, targetPort, URLs),
// check 6 (settings) and check 8 (orphans), none of which needs a call.
func TestServiceAndSettingsChecks(t *testing.T) {
	e := world(t)
	sys := namespace(t, e, "misc-system", nil)
	work := namespace(t, e, "misc-work", nil)
	labels := map[string]string{"app.kubernetes.io/name": "misc"}
	workload(t, e, sys, "misc-webhook", labels, 1)
	service(t, e, sys, "misc-webhook", labels)
	named := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "misc-named", Namespace: sys}, Spec: corev1.ServiceSpec{
		Selector: labels,
		Ports:    []corev1.ServicePort{{Name: portName, Port: 443, TargetPort: intstr.FromString("webhook-server")}},
	}}
	if _, err := e.Client.CoreV1().Services(sys).Create(e2eenv.TestCtx(t, apiTimeout), named, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bundle := newCA(t).pem()
	only := onlyNamespaces(work)
	gone := "gone-" + suffix()
	star := []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"CREATE"},
		Rule: admissionregistrationv1.Rule{APIGroups: []string{"*"}, APIVersions: []string{"*"}, Resources: []string{"*"}}}}
	port8443 := svcRef(sys, "misc-webhook")
	port8443.Port = ptr(int32(8443))
	const config = "misc-checks"
	validating(t, e, config,
		hook{Name: "missing-service.example.com", Service: svcRef(sys, "nope"), CABundle: bundle, NamespaceSelector: only},
		hook{Name: "wrong-port.example.com", Service: port8443, CABundle: bundle, NamespaceSelector: only},
		hook{Name: "named-target.example.com", Service: svcRef(sys, "misc-named"), CABundle: bundle, NamespaceSelector: only},
		hook{Name: "cluster-dns.example.com", URL: "https://misc-webhook." + sys + ".svc:443/validate", CABundle: bundle, NamespaceSelector: only},
		hook{Name: "localhost.example.com", URL: "https://127.0.0.1:1/validate", CABundle: bundle, NamespaceSelector: only},
		hook{Name: "slow-timeout.example.com", Service: svcRef(sys, "misc-webhook"), CABundle: bundle, TimeoutSeconds: 15, NamespaceSelector: only},
		hook{Name: "v1beta1.example.com", Service: svcRef(sys, "misc-webhook"), CABundle: bundle, ReviewVersions: []string{"v1beta1"}, NamespaceSelector: only},
		hook{Name: "star.example.com", Service: svcRef(sys, "misc-webhook"), CABundle: bundle, Rules: star, NamespaceSelector: only},
		hook{Name: "no-cabundle.example.com", Service: svcRef(sys, "misc-webhook"), NamespaceSelector: only},
		hook{Name: "orphan.example.com", Service: svcRef(gone, "svc"), CABundle: bundle, NamespaceSelector: only},
	)
	rep := runDoctor(t, e, doctor.Options{Names: []string{config}})
	get := func(n string) *doctor.WebhookReport { return hookReport(t, rep, config, n) }

	f := need(t, rep, get("missing-service.example.com"), doctor.IDServiceMissing, doctor.SeverityError)[0]
	contains(t, "KD101", f.What, "Service "+sys+"/nope does not exist")
	f = need(t, rep, get("wrong-port.example.com"), doctor.IDServicePortMissing, doctor.SeverityError)[0]
	contains(t, "KD102", f.What+f.Fix, "does not expose port 8443", "it exposes: 443",
		`kubectl patch validatingwebhookconfiguration misc-checks --type=json -p '[{"op":"add","path":"/webhooks/1/clientConfig/service/port","value":443}]'`)
	f = need(t, rep, get("named-target.example.com"), doctor.IDTargetPortMismatch, doctor.SeverityError)[0]
	contains(t, "KD103", f.What, `targetPort "webhook-server"`, "declares no container port with that name")
	f = need(t, rep, get("cluster-dns.example.com"), doctor.IDURLClusterDNS, doctor.SeverityError)[0]
	contains(t, "KD104 fix", f.Fix, `{"op":"remove","path":"/webhooks/3/clientConfig/url"}`,
		`"path":"/webhooks/3/clientConfig/service","value":{"name":"misc-webhook","namespace":"`+sys+`","path":"/validate","port":443}`)
	need(t, rep, get("localhost.example.com"), doctor.IDURLLocalhost, doctor.SeverityWarning)
	need(t, rep, get("localhost.example.com"), doctor.IDEndpointRefused, doctor.SeverityError)
	f = need(t, rep, get("slow-timeout.example.com"), doctor.IDTimeoutTooLong, doctor.SeverityWarning)[0]
	contains(t, "KD601 fix", f.Fix, `"path":"/webhooks/5/timeoutSeconds","value":5`)
	need(t, rep, get("v1beta1.example.com"), doctor.IDReviewVersions, doctor.SeverityWarning)
	need(t, rep, get("star.example.com"), doctor.IDWildcardResources, doctor.SeverityWarning)
	need(t, rep, get("no-cabundle.example.com"), doctor.IDCABundleMissing, doctor.SeverityError)
	f = need(t, rep, get("orphan.example.com"), doctor.IDOrphan, doctor.SeverityError)[0]
	contains(t, "KD801", f.What+f.Fix, "namespace "+gone+" does not exist", "kubectl delete validatingwebhookconfiguration misc-checks")
	if g := get("orphan.example.com"); g.Has(doctor.IDServiceMissing) {
		t.Errorf("orphan also reported as %s; the orphan finding says it all", doctor.IDServiceMissing)
	}

	// A name that does not exist: doctor could not run, exit 2.
	if _, err := doctor.Run(e2eenv.TestCtx(t, apiTimeout), e.Client, doctor.Options{Names: []string{"no-such-config"}}); !errors.Is(err, doctor.ErrNotFound) {
		t.Errorf("unknown name: err = %v; want ErrNotFound", err)
	}
	if e.Routed {
		if out, code := runPlugin(t, e, "doctor", "no-such-config"); code != 2 {
			t.Errorf("kubectl kadmit doctor no-such-config: exit %d; want 2\n%s", code, out)
		}
	}
}

// TestInterceptionChecks: check 5 beyond self-interception: kube-system,
// nodes, node leases, and a cycle between two webhooks.
func TestInterceptionChecks(t *testing.T) {
	e := world(t)
	nsA := namespace(t, e, "alpha-system", nil)
	nsB := namespace(t, e, "beta-system", nil)
	workload(t, e, nsA, "alpha-webhook", map[string]string{"app.kubernetes.io/name": "alpha"}, 1)
	workload(t, e, nsB, "beta-webhook", map[string]string{"app.kubernetes.io/name": "beta"}, 1)
	service(t, e, nsA, "alpha-webhook", map[string]string{"app.kubernetes.io/name": "alpha"})
	service(t, e, nsB, "beta-webhook", map[string]string{"app.kubernetes.io/name": "beta"})
	bundle := newCA(t).pem()
	rules := func(group, version, resource string, ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
		return []admissionregistrationv1.RuleWithOperations{{Operations: ops, Rule: admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{version}, Resources: []string{resource}}}}
	}
	// Created after the workloads, so that these Fail webhooks never see
	// the test's own objects; nothing else creates pods, nodes or leases in
	// the namespaces they select.
	const config = "interception-checks"
	validating(t, e, config,
		hook{Name: "alpha.example.com", Service: svcRef(nsA, "alpha-webhook"), CABundle: bundle, Fail: true, NamespaceSelector: onlyNamespaces(nsB)},
		hook{Name: "beta.example.com", Service: svcRef(nsB, "beta-webhook"), CABundle: bundle, Fail: true, NamespaceSelector: onlyNamespaces(nsA)},
		hook{Name: "kube-system.example.com", Service: svcRef(nsA, "alpha-webhook"), CABundle: bundle, Fail: true, NamespaceSelector: onlyNamespaces("kube-system")},
		hook{Name: "nodes.example.com", Service: svcRef(nsA, "alpha-webhook"), CABundle: bundle, Fail: true, Rules: rules("", "v1", "nodes", "CREATE")},
		hook{Name: "leases.example.com", Service: svcRef(nsA, "alpha-webhook"), CABundle: bundle, Fail: true,
			Rules: rules("coordination.k8s.io", "v1", "leases", "UPDATE"), NamespaceSelector: onlyNamespaces("kube-node-lease")},
	)
	rep := runDoctor(t, e, doctor.Options{Names: []string{config}})
	for _, pair := range [][2]string{{"alpha.example.com", "beta-webhook"}, {"beta.example.com", "alpha-webhook"}} {
		f := need(t, rep, hookReport(t, rep, config, pair[0]), doctor.IDInterceptsOtherHook, doctor.SeverityError)[0]
		contains(t, pair[0]+" KD505", f.What, "a cycle", pair[1])
	}
	f := need(t, rep, hookReport(t, rep, config, "kube-system.example.com"), doctor.IDInterceptsKubeSystem, doctor.SeverityWarning)[0]
	contains(t, "KD502 fix", f.Fix, `"path":"/webhooks/2/namespaceSelector/matchExpressions/-","value":{"key":"kubernetes.io/metadata.name","operator":"NotIn","values":["kube-system"]}`)
	f = need(t, rep, hookReport(t, rep, config, "nodes.example.com"), doctor.IDInterceptsNodes, doctor.SeverityWarning)[0]
	contains(t, "KD503 fix", f.Fix, `"path":"/webhooks/3/failurePolicy","value":"Ignore"`)
	need(t, rep, hookReport(t, rep, config, "leases.example.com"), doctor.IDInterceptsNodeLeases, doctor.SeverityWarning)
}

// TestHealthyKadmitInstall: two `kadmit serve --tls=self-managed --register`
// replicas behind a Service, with a PodDisruptionBudget: doctor must find no
// error (and no warning), and the probes must be admitted.
func TestHealthyKadmitInstall(t *testing.T) {
	e := routedWorld(t)
	sys := namespace(t, e, "kadmit-system", nil)
	work := namespace(t, e, "kadmit-work", nil)
	labels := map[string]string{"app.kubernetes.io/name": "kadmit"}
	// The chart's termination: a preStop sleep inside the grace period
	// (deploy/helm/kadmit/templates/deployment.yaml), which KD203 wants.
	pods := workload(t, e, sys, "kadmit", labels, 2, func(s *corev1.PodSpec) {
		s.TerminationGracePeriodSeconds = ptr(int64(45))
		s.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 10}}}
	})
	service(t, e, sys, "kadmit", labels)
	if _, err := e.Client.PolicyV1().PodDisruptionBudgets(sys).Create(e2eenv.TestCtx(t, apiTimeout), &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "kadmit"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// kadmit --register writes these; remove them after the replicas
	// stopped (cleanups run last-in first-out), or their Fail webhooks would
	// reject every later pod.
	t.Cleanup(func() {
		// t.Context() is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		defer cancel()
		reg := e.Client.AdmissionregistrationV1()
		if err := reg.MutatingWebhookConfigurations().Delete(ctx, kadmitproc.ConfigName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete kadmit MutatingWebhookConfiguration: %v", err)
		}
		if err := reg.ValidatingWebhookConfigurations().Delete(ctx, kadmitproc.ConfigName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete kadmit ValidatingWebhookConfiguration: %v", err)
		}
	})
	var eps []ep
	var procs []*kadmitproc.Process
	for i, pod := range pods {
		ip := nextIP(t)
		if err := netns.AddLoopbackAddr(ip); err != nil {
			t.Fatal(err)
		}
		addr, metrics := net.JoinHostPort(ip, strconv.Itoa(targetPort)), net.JoinHostPort(ip, "8080")
		logFile, err := os.Create(filepath.Join(e.Tmp, fmt.Sprintf("kadmit-%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		p, err := kadmitproc.Start(kadmitproc.Options{Binary: e.Binary, Addr: addr, MetricsAddr: metrics, Log: logFile, Args: []string{"serve",
			"--tls=self-managed", "--register", "--namespace", sys, "--service-name", "kadmit", "--service-port", "443",
			"--kubeconfig", e.Kubeconfig, "--addr", addr, "--metrics-addr", metrics,
			"--shutdown-grace", "2s", "--log-format", "json"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, _, err := p.Terminate(15 * time.Second); err != nil {
				t.Errorf("stop kadmit replica %d: %v", i, err)
			}
			_ = logFile.Close()
		})
		procs = append(procs, p)
		eps = append(eps, ep{IP: ip, Pod: pod, Ready: true})
	}
	for _, p := range procs {
		if err := p.WaitReady(e2eenv.TestCtx(t, 90*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	endpointSlice(t, e, sys, "kadmit", eps...)
	if err := procs[0].WaitEffective(e2eenv.TestCtx(t, 90*time.Second), e.Client, work); err != nil {
		t.Fatal(err)
	}

	rep := runDoctor(t, e, doctor.Options{Names: []string{kadmitproc.ConfigName}, Probe: true, ProbeCount: 2})
	t.Logf("doctor's report:\n%s", render(rep))
	if len(rep.Webhooks) < 4 {
		t.Fatalf("report covers %d webhooks; want kadmit's 4 or more", len(rep.Webhooks))
	}
	if rep.Errors != 0 || rep.Warnings != 0 {
		t.Errorf("healthy install: %d error(s), %d warning(s); want none", rep.Errors, rep.Warnings)
	}
	admitted := 0
	for _, w := range rep.Webhooks {
		if w.Has(doctor.IDProbeAdmitted) {
			admitted++
		}
	}
	if admitted != len(rep.Webhooks) {
		t.Errorf("%d of %d webhooks admitted the probe; want all", admitted, len(rep.Webhooks))
	}

	out, code := runPlugin(t, e, "doctor", kadmitproc.ConfigName, "-o", "json", "--probe", "--probe-count", "1")
	if code != 0 {
		t.Fatalf("kubectl kadmit doctor kadmit: exit %d; want 0\n%s", code, out)
	}
	var got doctor.Report
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("JSON output does not parse: %v\n%s", err, out)
	}
	if got.Errors != 0 || len(got.Webhooks) != len(rep.Webhooks) {
		t.Errorf("JSON report: %d errors over %d webhooks; want 0 over %d", got.Errors, len(got.Webhooks), len(rep.Webhooks))
	}
}

// kubectlPath is the kubectl these tests run: the one hack/controlplane.sh
// builds next to kube-apiserver (KADMIT_CONTROLPLANE_DIR), else one on
// PATH. Without either the test is skipped, or fails under
// KADMIT_E2E_REQUIRED=1: a required run must not pass without running the
// plugin and the printed fix.
func kubectlPath(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("KADMIT_CONTROLPLANE_DIR"); dir != "" {
		p := filepath.Join(dir, "kubectl")
		if info, err := os.Stat(p); err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0 {
			return p
		}
	}
	p, err := exec.LookPath("kubectl")
	if err != nil {
		msg := fmt.Sprintf("kubectl neither in KADMIT_CONTROLPLANE_DIR (hack/controlplane.sh builds it there) nor on PATH: %v", err)
		if os.Getenv("KADMIT_E2E_REQUIRED") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg + " (set KADMIT_E2E_REQUIRED=1 to fail instead of skip)")
	}
	return p
}
