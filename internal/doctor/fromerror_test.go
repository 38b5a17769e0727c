package doctor

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/version"
	webhookerrors "k8s.io/apiserver/pkg/admission/plugin/webhook/errors"
	"k8s.io/client-go/kubernetes/fake"
)

// errCallingWebhook is k8s.io/apiserver v0.37.1 pkg/util/webhook.ErrCallingWebhook's
// Error (error.go:34-38), copied because importing that package pulls the
// API server's egress selector (gRPC) into this module.
type errCallingWebhook struct {
	WebhookName string
	Reason      error
}

func (e *errCallingWebhook) Error() string {
	if e.Reason != nil {
		return fmt.Sprintf("failed calling webhook %q: %v", e.WebhookName, e.Reason)
	}
	return fmt.Sprintf("failed calling webhook %q; no further details available", e.WebhookName)
}

// callError builds the API server's message exactly as
// validating/dispatcher.go:311 and generic/webhook.go do: a url.Error from
// the REST client, wrapped "failed to call webhook: %w", in
// ErrCallingWebhook, in apierrors.NewInternalError (failurePolicy Fail).
func callError(hook, rawURL string, cause error) string {
	call := &errCallingWebhook{WebhookName: hook, Reason: fmt.Errorf("failed to call webhook: %w", &url.Error{Op: "Post", URL: rawURL, Err: cause})}
	return apierrors.NewInternalError(call).Error()
}

func dialErr(addr string, errno syscall.Errno) error {
	return &net.OpError{Op: "dial", Net: "tcp", Addr: mustAddr(addr), Err: &os.SyscallError{Syscall: "connect", Err: errno}}
}

func mustAddr(s string) net.Addr {
	a, err := net.ResolveTCPAddr("tcp", s)
	if err != nil {
		panic(err)
	}
	return a
}

func leaf(t *testing.T, names ...string) *x509.Certificate {
	t.Helper()
	ca, key, err := webhookcerts.NewCA(time.Now(), 24*time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := webhookcerts.IssueServing(ca, key, names, nil, time.Now(), time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := webhookcerts.ParseCertificates(p)
	if err != nil {
		t.Fatal(err)
	}
	return cs[0]
}

func TestParseErrorFormats(t *testing.T) {
	const u = "https://lws-webhook-service.lws-system.svc:443/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset?timeout=10s"
	kueueCert := leaf(t, "kueue-webhook-service.lws-system.svc")
	tlsVerify := func(err error) error { return fmt.Errorf("tls: failed to verify certificate: %w", err) }
	cases := []struct {
		name, msg, hook, format, cause, first, service string
	}{
		{"connection refused", callError("vleaderworkerset.kb.io", u, dialErr("10.96.33.70:443", syscall.ECONNREFUSED)),
			"vleaderworkerset.kb.io", "call failed", "connection refused", IDEndpointRefused, "lws-system/lws-webhook-service"},
		// The real cluster's seed 004 under load: kube-proxy still sends the
		// ClusterIP to the pod that just went.
		{"no route to host", callError("mpod.kb.io", "https://kruise-webhook-service.kruise-system.svc:443/mutate-pod?timeout=10s", dialErr("10.96.161.86:443", syscall.EHOSTUNREACH)),
			"mpod.kb.io", "call failed", "no route to host", IDNoReadyEndpoints, "kruise-system/kruise-webhook-service"},
		{"no endpoints", callError("mpod.kb.io", "https://kruise-webhook-service.kruise-system.svc:443/mutate-pod?timeout=10s",
			apierrors.NewServiceUnavailable(fmt.Sprintf("no endpoints available for service %q", "kruise-webhook-service"))),
			"mpod.kb.io", "call failed", "no endpoints", IDNoReadyEndpoints, "kruise-system/kruise-webhook-service"},
		{"service not found", callError("mpod.kb.io", "https://kruise-webhook-service.kruise-system.svc:443/mutate-pod?timeout=10s",
			apierrors.NewNotFound(corev1.Resource("service"), "kruise-webhook-service")), "mpod.kb.io", "call failed", "service not found", IDOrphan, "kruise-system/kruise-webhook-service"},
		{"unknown authority", callError("vleaderworkerset.kb.io", u, tlsVerify(x509.UnknownAuthorityError{})),
			"vleaderworkerset.kb.io", "call failed", "x509 unknown authority", IDUnknownAuthority, "lws-system/lws-webhook-service"},
		{"SAN mismatch", callError("vleaderworkerset.kb.io", u, tlsVerify(x509.HostnameError{Certificate: kueueCert, Host: "lws-webhook-service.lws-system.svc"})),
			"vleaderworkerset.kb.io", "call failed", "x509 SAN mismatch", IDSelectorCollision, "lws-system/lws-webhook-service"},
		{"expired", callError("vleaderworkerset.kb.io", u, tlsVerify(x509.CertificateInvalidError{Cert: kueueCert, Reason: x509.Expired, Detail: "current time 2026-11-23T16:00:00Z is after 2026-11-01T00:00:00Z"})),
			"vleaderworkerset.kb.io", "call failed", "x509 expired", IDServingCertExpiry, "lws-system/lws-webhook-service"},
		{"timeout", callError("vleaderworkerset.kb.io", u, context.DeadlineExceeded),
			"vleaderworkerset.kb.io", "call failed", "timeout", IDProbeTimeout, "lws-system/lws-webhook-service"},
		{"no service port", callError("v.example.com", "https://svc.ns.svc:8443/v?timeout=5s", apierrors.NewServiceUnavailable(fmt.Sprintf("no service port %d found for service %q", 8443, "svc"))),
			"v.example.com", "call failed", "no service port", IDServicePortMissing, "ns/svc"},
		{"invalid response", apierrors.NewInternalError(&errCallingWebhook{WebhookName: "v.example.com", Reason: fmt.Errorf("received invalid webhook response: %w", errors.New("expected response.uid=\"1\", got \"2\""))}).Error(),
			"v.example.com", "call failed", "bad response", IDProbeBadResponse, ""},
		{"no details", apierrors.NewInternalError(&errCallingWebhook{WebhookName: "v.example.com"}).Error(), "v.example.com", "call failed", "no details", IDProbeBadResponse, ""},
		{"denied", webhookerrors.ToStatusErr("vpod.kb.io", &metav1.Status{Message: "pod name too long"}).Error(), "vpod.kb.io", "denied", "denied by the webhook", IDProbeDenied, ""},
		{"denied without explanation", webhookerrors.ToStatusErr("vpod.kb.io", nil).Error(), "vpod.kb.io", "denied", "denied by the webhook", IDProbeDenied, ""},
		{"dry run", webhookerrors.NewDryRunUnsupportedErr("v.example.com").Error(), "v.example.com", "dry run unsupported", "sideEffects forbid dry run", IDSideEffectsDryRun, ""},
	}
	for _, c := range cases {
		for _, wrap := range []struct{ name, pre string }{
			{"as is", ""},
			{"kubectl", `Error from server (InternalError): error when creating "lws.yaml": `},
			{"event, escaped", "Error creating: "},
		} {
			msg := wrap.pre + c.msg
			if wrap.name == "event, escaped" {
				msg = strings.ReplaceAll(msg, `"`, `\"`)
			}
			m, err := ParseError(msg)
			if err != nil {
				t.Errorf("%s (%s): %v\n%s", c.name, wrap.name, err, msg)
				continue
			}
			if m.Webhook != c.hook || m.Format != c.format || m.Cause != c.cause || len(m.Explaining) == 0 || m.Explaining[0] != c.first || m.Service != c.service {
				t.Errorf("%s (%s): ParseError(%q) = %+v; want webhook %s format %q cause %q first %s service %q", c.name, wrap.name, msg, m, c.hook, c.format, c.cause, c.first, c.service)
			}
		}
	}
}

func TestParseErrorPolicies(t *testing.T) {
	for _, c := range []struct{ msg, policy, binding, cause string }{
		{"policy 'limits' with binding 'limits-prod' denied request: failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction", "limits", "limits-prod", "params not found"},
		{"ValidatingAdmissionPolicy 'replicas' with binding 'replicas-test' denied request: failed expression: object.spec.replicas <= 5", "replicas", "replicas-test", "denied by the policy"},
		{`policy "replicas" denied request: failed expression: object.spec.replicas <= 5`, "replicas", "", "denied by the policy"},
		// As kube-apiserver v1.37.1 answers when paramKind's CRD is not served (seen in e2e).
		{"ValidatingAdmissionPolicy 'required-labels' denied request: failed to configure policy: failed to find resource referenced by paramKind: 'constraints.gatekeeper.sh/v1beta1, Kind=K8sRequiredLabels'", "required-labels", "", "params not found"},
	} {
		m, err := ParseError(`deployments.apps "d" is forbidden: ` + c.msg)
		if err != nil || m.Policy != c.policy || m.Binding != c.binding || m.Cause != c.cause {
			t.Errorf("ParseError(%q) = %+v, %v", c.msg, m, err)
		}
	}
}

func TestParseErrorBounds(t *testing.T) {
	if _, err := ParseError(strings.Repeat("x", MaxErrorMessage+1)); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("oversized message: err = %v", err)
	}
	for _, msg := range []string{"", "Error from server (Forbidden): pods is forbidden: User \"bob\" cannot create resource", `failed calling webhook "` + strings.Repeat("a", 300) + `": x`} {
		if _, err := ParseError(msg); !errors.Is(err, ErrNoWebhookInMessage) {
			t.Errorf("ParseError(%.60q) = %v; want ErrNoWebhookInMessage", msg, err)
		}
	}
	// The worst case at the bound: many partial matches. Go's regexp is
	// linear; this only has to finish and find the real one at the end.
	junk := strings.Repeat(`failed calling webhook "`, (MaxErrorMessage-200)/24)
	m, err := ParseError(junk + callError("x.example.com", "https://s.n.svc:443/", dialErr("10.0.0.1:443", syscall.ECONNREFUSED))[:150])
	if err != nil || m.Webhook != "x.example.com" {
		t.Errorf("at the bound: %+v, %v", m, err)
	}
}

// Diagnose leads with the finding that explains the message: the SAN
// mismatch of LeaderWorkerSet #528 is explained by the selector collision.
func TestFromErrorLeads(t *testing.T) {
	lws := map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "lws"}
	lwsPod := rsPod("lws-controller-manager", "5b8c9d7f6", lws, "10.0.0.5")
	kueuePod := rsPod("kueue-controller-manager", "7d9f6c4b8", kueueLabels(), "10.0.0.7")
	objs := []runtime.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lwsNS}},
		deployment("lws-controller-manager", lws), deployment("kueue-controller-manager", kueueLabels()), lwsPod, kueuePod,
		replicaSet("lws-controller-manager", "5b8c9d7f6", lws), replicaSet("kueue-controller-manager", "7d9f6c4b8", kueueLabels()),
		svc("lws-webhook-service", map[string]string{"control-plane": "controller-manager"}), slice("lws-webhook-service", lwsPod, kueuePod),
		mutatingConfig("lws-mutating-webhook-configuration", "mleaderworkerset.kb.io", "lws-webhook-service"),
		mutatingConfig("other", "mleaderworkerset.kb.io", "elsewhere"),
	}
	msg := callError("mleaderworkerset.kb.io", "https://lws-webhook-service.lws-system.svc:443/mutate?timeout=10s",
		fmt.Errorf("tls: failed to verify certificate: %w", x509.HostnameError{Certificate: leaf(t, "kueue-webhook-service.lws-system.svc"), Host: "lws-webhook-service.lws-system.svc"}))
	cs := fake.NewClientset(objs...)
	snap, err := LoadSnapshot(context.Background(), cs)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Diagnose(context.Background(), cs, snap, Options{FromError: msg, Dial: func(context.Context, string, string) (net.Conn, error) { return nil, ErrDialNotAllowed }})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Webhooks) != 1 || rep.Webhooks[0].Configuration != "lws-mutating-webhook-configuration" {
		t.Fatalf("want only the webhook the URL's Service names; got %+v", rep.Webhooks)
	}
	fs := rep.Webhooks[0].Findings
	if fs[0].ID != IDFromError || !strings.Contains(fs[0].What, "KD301 explains it") || fs[1].ID != IDSelectorCollision || !fs[1].Lead {
		t.Fatalf("want KD002 then KD301 first; got %+v", fs[:2])
	}
	if rep.FromError.Explained != IDSelectorCollision || rep.FromError.Cause != "x509 SAN mismatch" {
		t.Errorf("FromError = %+v", rep.FromError)
	}

	// A webhook the cluster does not have: doctor says so.
	_, err = Diagnose(context.Background(), cs, snap, Options{FromError: strings.ReplaceAll(msg, "mleaderworkerset.kb.io", "gone.example.com")})
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown webhook: err = %v", err)
	}
	_ = admissionregistrationv1.Fail
}

// Seed 004 on a real cluster: the webhook intercepts the creation of its
// own pods (KD501), none runs, and the ReplicaSet's FailedCreate event says
// "connection refused". KD201 is what produces the message, but KD501 is
// why it never clears: KD501 leads, KD201 follows it.
func TestFromErrorSelfInterceptionLeads(t *testing.T) {
	lbls := map[string]string{"app.kubernetes.io/name": "kruise", "control-plane": "controller-manager"}
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kruise-mutating-webhook-configuration"}, Webhooks: []admissionregistrationv1.MutatingWebhook{{
		Name: "mpod.kb.io", ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: testBundle, Service: &admissionregistrationv1.ServiceReference{Namespace: lwsNS, Name: "kruise-webhook-service", Path: ptrTo("/mutate-pod"), Port: ptrTo(int32(443))}},
		Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"CREATE"},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
		FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
		NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "control-plane", Operator: metav1.LabelSelectorOpDoesNotExist}}},
	}}}
	placeholder := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "kruise-webhook-service-abcde", Namespace: lwsNS,
		Labels: map[string]string{discoveryv1.LabelServiceName: "kruise-webhook-service"}}, AddressType: discoveryv1.AddressTypeIPv4}
	cs := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lwsNS, Labels: map[string]string{"kubernetes.io/metadata.name": lwsNS}}},
		deployment("kruise-controller-manager", lbls), svc("kruise-webhook-service", lbls), placeholder, cfg)
	snap, err := LoadSnapshot(context.Background(), cs)
	if err != nil {
		t.Fatal(err)
	}
	msg := "Error creating: " + callError("mpod.kb.io", "https://kruise-webhook-service.lws-system.svc:443/mutate-pod?timeout=10s", dialErr("10.96.121.92:443", syscall.ECONNREFUSED))
	rep, err := Diagnose(context.Background(), cs, snap, Options{FromError: msg, Dial: func(context.Context, string, string) (net.Conn, error) { return nil, ErrDialNotAllowed }})
	if err != nil {
		t.Fatal(err)
	}
	fs := rep.Webhooks[0].Findings
	var order []string
	for _, f := range fs {
		order = append(order, f.ID)
	}
	if len(fs) < 3 || fs[0].ID != IDFromError || fs[1].ID != IDSelfInterception || !fs[1].Lead || fs[2].ID != IDNoReadyEndpoints || fs[2].Lead {
		t.Fatalf("want KD002, KD501 (lead), KD201; got %v", order)
	}
	if rep.FromError.Explained != IDSelfInterception || !strings.Contains(fs[0].What, "KD501 explains it, through KD201") || !strings.Contains(fs[0].Why, "does not recover because of KD501") {
		t.Errorf("FromError %+v; KD002 %q / %q", rep.FromError, fs[0].What, fs[0].Why)
	}
	var b strings.Builder
	if err := WriteTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "Explained by KD501") || strings.Index(out, "> ERROR   KD501") < 0 || strings.Index(out, "> ERROR   KD501") > strings.Index(out, "ERROR   KD201") {
		t.Errorf("table:\n%s", out)
	}
}

// KD004: a message naming a webhook or policy of the API server's
// manifest-based admission configuration (KEP-5793: names ending in
// .static.k8s.io), which the API does not show, is explained as such from
// 1.36 on (or when the version is unknown), instead of "not found".
func TestFromErrorStaticAdmission(t *testing.T) {
	snap := &Snapshot{Namespaces: map[string]map[string]string{}, NamespacesKnown: true, Backends: map[string]*Backend{}, Policies: &PolicySet{}}
	noDial := func(context.Context, string, string) (net.Conn, error) { return nil, ErrDialNotAllowed }
	msg := "Error from server (InternalError): Internal error occurred: " +
		callError("deny-privileged.static.k8s.io", "https://10.0.0.5:8443/validate?timeout=10s", dialErr("10.0.0.5:8443", syscall.ECONNREFUSED))

	snap.ServerVersion = v135 // no static admission: the webhook is gone
	if _, err := Diagnose(context.Background(), nil, snap, Options{FromError: msg, Dial: noDial}); !errors.Is(err, ErrNotFound) || strings.Contains(err.Error(), "staticManifestsDir") {
		t.Errorf("1.35: err = %v", err)
	}
	for _, c := range []struct {
		v    *version.Info
		note string
	}{{v136, "alpha in 1.36"}, {v137, ""}, {nil, "could not read"}} {
		snap.ServerVersion = c.v
		rep, err := Diagnose(context.Background(), nil, snap, Options{FromError: msg, Dial: noDial})
		if err != nil {
			t.Fatalf("%+v: %v", c.v, err)
		}
		if len(rep.Webhooks) != 1 || rep.FromError.Explained != IDStaticAdmission {
			t.Fatalf("%+v: %+v", c.v, rep)
		}
		fs := rep.Webhooks[0].Findings
		if len(fs) != 2 || fs[0].ID != IDFromError || fs[1].ID != IDStaticAdmission || !fs[1].Lead || fs[1].Severity != SeverityWarning {
			t.Fatalf("%+v: %+v", c.v, fs)
		}
		if !strings.Contains(fs[1].What, "manifest-based admission configuration (KEP-5793)") || !strings.Contains(fs[1].What, c.note) ||
			!strings.Contains(fs[1].Why, "--admission-control-config-file") || !strings.Contains(fs[1].Fix, "grep -rl deny-privileged.static.k8s.io") ||
			!strings.Contains(fs[1].Fix, "https://10.0.0.5:8443/validate") {
			t.Errorf("%+v: KD004 %+v", c.v, fs[1])
		}
		var b strings.Builder
		if err := WriteTable(&b, rep); err != nil {
			t.Fatal(err)
		}
		if out := b.String(); !strings.Contains(out, "Explained by KD004") || !strings.Contains(out, "manifest-based (static) (kind unknown)") {
			t.Errorf("table:\n%s", out)
		}
	}

	// A webhook the API does not show, without the suffix: the webhooks
	// inside a static configuration may be named anything, so from 1.36
	// the error says where else to look.
	other := strings.ReplaceAll(msg, "deny-privileged.static.k8s.io", "gone.example.com")
	for v, hint := range map[*version.Info]bool{v135: false, v136: true, v137: true, nil: true} {
		snap.ServerVersion = v
		_, err := Diagnose(context.Background(), nil, snap, Options{FromError: other, Dial: noDial})
		if !errors.Is(err, ErrNotFound) || strings.Contains(err.Error(), "staticManifestsDir") != hint {
			t.Errorf("%+v: err = %v", v, err)
		}
	}

	// The static webhook answered and denied: KD004 is information.
	snap.ServerVersion = v137
	denied := `admission webhook "deny-privileged.static.k8s.io" denied the request: privileged containers are not allowed`
	rep, err := Diagnose(context.Background(), nil, snap, Options{FromError: denied, Dial: noDial})
	if err != nil || rep.Webhooks[0].ByID(IDStaticAdmission)[0].Severity != SeverityInfo {
		t.Errorf("denied: %v %+v", err, rep)
	}

	// A static policy's denial.
	pol := "ValidatingAdmissionPolicy 'deny-privileged.static.k8s.io' with binding 'deny-privileged-binding.static.k8s.io' denied request: privileged containers are not allowed"
	rep, err = Diagnose(context.Background(), nil, snap, Options{FromError: pol, Dial: noDial})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Policies) != 1 || rep.Policies[0].Kind != "ValidatingAdmissionPolicy" || rep.Policies[0].Name != "deny-privileged.static.k8s.io" {
		t.Fatalf("policy: %+v", rep.Policies)
	}
	fs := rep.Policies[0].Findings
	if len(fs) != 2 || fs[0].ID != IDFromError || !strings.Contains(fs[0].Why, "privileged containers are not allowed") || fs[1].ID != IDStaticAdmission ||
		fs[1].Severity != SeverityInfo || !strings.Contains(fs[1].What, `with its binding "deny-privileged-binding.static.k8s.io"`) || rep.FromError.Explained != IDStaticAdmission {
		t.Errorf("policy findings: %+v", fs)
	}
	snap.ServerVersion = v135
	if rep, err = Diagnose(context.Background(), nil, snap, Options{FromError: pol, Dial: noDial}); err != nil || len(rep.Policies) != 0 {
		t.Errorf("1.35 policy: %v %+v", err, rep.Policies)
	}
}
