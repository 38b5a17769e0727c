package deploy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/deploy/internal/audit"
	"github.com/kadmit/kadmit/test/deploy/internal/proc"
)

// TestWatchRBACOnRealAPIServer is issue 15's least-privilege proof: two
// `kadmit watch` replicas, built from this repository and run with the
// chart's exact container args and env, act as the chart's watch
// ServiceAccount (and nothing more) on a real API server with the audit log
// on, through leader election and evaluations of a few webhook
// configurations until a finding is exported and recorded as an Event. The
// audit log then shows every request of the ServiceAccount was allowed (a
// 403 would mean the chart's RBAC is short) and was a read, an Event in
// "default" or its own Lease; every grant of the chart is used or said why
// not.
func TestWatchRBACOnRealAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real API server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	c := startCluster(t, ctx)
	ns := chart.Namespace
	r := render(t, chart.ReleaseName, ns, watchOn(nil))

	// The chart's namespace and every object of the watch, as Helm applies them.
	var watchObjs []*unstructured.Unstructured
	for _, o := range r.Objects {
		if o.GetKind() == "Namespace" || isWatchObject(o) {
			if err := c.apply(ctx, o); err != nil {
				t.Fatal(err)
			}
			watchObjs = append(watchObjs, o)
		}
	}
	if w := c.takeWarnings(); len(w) > 0 {
		t.Fatalf("API server warnings while applying the watch: %q", w)
	}

	// A few webhook configurations: a Fail webhook whose Service has no
	// endpoint (KD201), and an Ignore webhook on a loopback URL nothing
	// listens on. Their namespaceSelector matches no namespace, so they
	// intercept nothing here.
	if _, err := c.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.admin.CoreV1().Services("tenant").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "hook"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "hook"}, Ports: []corev1.ServicePort{{Port: 443, TargetPort: intstr.FromInt32(9443)}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fail, ignore := admissionregistrationv1.Fail, admissionregistrationv1.Ignore
	none := admissionregistrationv1.SideEffectClassNone
	nowhere := &metav1.LabelSelector{MatchLabels: map[string]string{"kadmit-test": "never"}}
	rules := []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}}
	path := "/validate"
	if _, err := c.admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "health-fail"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "vhook.example.com", FailurePolicy: &fail, SideEffects: &none,
			AdmissionReviewVersions: []string{"v1"}, Rules: rules, NamespaceSelector: nowhere,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: "tenant", Name: "hook", Path: &path}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	closed, _ := kadmitproc.FreeAddr()
	url := "https://" + closed + "/mutate"
	if _, err := c.admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "health-url"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "mhook.example.com", FailurePolicy: &ignore, SideEffects: &none,
			AdmissionReviewVersions: []string{"v1"}, Rules: rules, NamespaceSelector: nowhere,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	root, err := chart.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir() + "/kadmit"
	if err := kadmitproc.Build(ctx, root, bin); err != nil {
		t.Fatal(err)
	}
	var dep appsv1.Deployment
	toTyped(t, mustFind(t, r, "Deployment", "kadmit-watch"), &dep)
	container := dep.Spec.Template.Spec.Containers[0]
	if container.Args[0] != "watch" {
		t.Fatalf("container args %q", container.Args)
	}
	kubeconfig := c.kubeconfigAs(t, watchUser)
	// One process per replica with the container's exact args and env,
	// plus (in a pod: the ServiceAccount token and the pod's own port) the
	// impersonating kubeconfig and a loopback metrics address.
	var ps []*proc.Process
	for i := range 2 {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("kadmit-watch-6d5f7c9b8-%c", 'a'+i), Namespace: ns}}
		maddr, _ := kadmitproc.FreeAddr()
		args := append(slices.Clone(container.Args), "--kubeconfig="+kubeconfig, "--metrics-addr="+maddr, "--handshake-interval=5s")
		p, err := proc.Start(pod.Name, bin, args, containerEnv(t, container, pod), "", maddr, nil)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	t.Cleanup(func() {
		for _, p := range ps {
			_, _ = p.Terminate(20 * time.Second)
			if t.Failed() {
				t.Logf("%s log tail:\n%s", p.Name, p.Tail(30))
			}
		}
	})
	for _, p := range ps {
		if err := poll(ctx, 90*time.Second, p.Name+" ready", func() error {
			select {
			case <-p.Exited():
				return fmt.Errorf("exited %d:\n%s", p.ExitCode(), p.Tail(20))
			default:
			}
			return p.Ready(ctx)
		}); err != nil {
			t.Fatal(err)
		}
	}

	// The leader holds the chart's Lease, exports the finding and records it.
	var leader *proc.Process
	if err := poll(ctx, 60*time.Second, "a leader", func() error {
		l, err := c.admin.CoordinationV1().Leases(ns).Get(ctx, "kadmit-watch", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, p := range ps {
			if p.Name == ptrVal(l.Spec.HolderIdentity) {
				leader = p
				return nil
			}
		}
		return fmt.Errorf("held by %q", ptrVal(l.Spec.HolderIdentity))
	}); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, 60*time.Second, "KD201 exported and recorded", func() error {
		m, err := leader.Metrics(ctx)
		if err != nil {
			return err
		}
		if !strings.Contains(m, `kadmit_watch_findings{check="KD201",configuration="health-fail",severity="error",webhook="vhook.example.com"} 1`) {
			return errors.New("no KD201 series yet")
		}
		evs, err := c.admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "reason=KD201"})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "health-fail" && e.Type == corev1.EventTypeWarning && e.Source.Component == "kadmit-watch" {
				return nil
			}
		}
		return fmt.Errorf("no KD201 Event on health-fail among %d", len(evs.Items))
	}); err != nil {
		t.Fatal(err)
	}
	m, err := leader.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kadmit_watch_leader 1", "kadmit_watch_webhook_info{", "kadmit_watch_ready_endpoints{", "kadmit_watch_evaluations_total "} {
		if !strings.Contains(m, "\n"+name) {
			t.Errorf("leader's /metrics lacks %s", name)
		}
	}
	// A few more handshake rounds and Lease renewals, then stop both.
	time.Sleep(12 * time.Second)
	for _, p := range ps {
		if code, err := p.Terminate(20 * time.Second); err != nil || code != 0 {
			t.Errorf("%s: exit %d, %v\n%s", p.Name, code, err, p.Tail(20))
		}
		if out := strings.ToLower(p.Output()); strings.Contains(out, "forbidden") {
			t.Errorf("%s was refused an API call:\n%s", p.Name, grepLines(p.Output(), "orbidden"))
		}
	}

	// The audit log against the chart.
	calls := auditedCalls(t, c, watchUser, "kadmit-watch")
	grants, err := audit.BoundGrants(watchUser, watchObjs...)
	if err != nil {
		t.Fatal(err)
	}
	// SelfSubjectAccessReview (the watch asks which informers it may run)
	// is granted to every authenticated user by the API server's default
	// system:basic-user ClusterRoleBinding, not by the chart.
	ssar := audit.Call{Group: "authorization.k8s.io", Resource: "selfsubjectaccessreviews", Verb: "create", Allowed: true}
	var chartCalls []audit.Call
	for _, cl := range calls {
		if !cl.Allowed {
			t.Errorf("403: %s; the chart's RBAC for kadmit watch is short", cl)
		}
		isRead := slices.Contains(readVerbs, cl.Verb)
		okWrite := (cl.Group == "" && cl.Resource == "events" && cl.Namespace == "default" && (cl.Verb == "create" || cl.Verb == "patch")) ||
			(cl.Group == "coordination.k8s.io" && cl.Resource == "leases" && cl.Namespace == ns && (cl.Verb == "create" || cl.Name == "kadmit-watch"))
		switch {
		case cl.Group == ssar.Group && cl.Resource == ssar.Resource && cl.Verb == ssar.Verb:
			continue
		case !isRead && !okWrite:
			t.Errorf("kadmit watch made %s: neither a read, an Event in default, nor its Lease", cl)
		}
		chartCalls = append(chartCalls, cl)
	}
	// A resource the watch may not read is not a 403 here: it asks first
	// (SelfSubjectAccessReview) and runs no informer for it. So every
	// informer resource must have been watched (or listed).
	for _, res := range watchInformerResources(t) {
		if !slices.ContainsFunc(calls, func(cl audit.Call) bool {
			return cl.Allowed && cl.Group == res[0] && cl.Resource == res[1] && (cl.Verb == "watch" || cl.Verb == "list")
		}) {
			t.Errorf("kadmit watch never watched %s/%s: the chart's RBAC is short (it ran without that informer)", res[0], res[1])
		}
	}
	uncovered, unused := audit.Compare(chartCalls, grants)
	for _, u := range uncovered {
		t.Errorf("call not granted by the chart: %s", u)
	}
	// Grants a run may leave unused, each with why; anything else unused is
	// a grant the chart should not make.
	mayBeUnused := func(g audit.Grant) string {
		switch {
		case g.Verb == "list" && g.Group != "admissionregistration.k8s.io" || g.Verb == "list" && strings.HasSuffix(g.Resource, "webhookconfigurations"):
			return "client-go's informers list through a streaming watch (sendInitialEvents) on a v1.37 API server; plain list is their fallback elsewhere"
		case g.Resource == "events" && g.Verb == "patch":
			return "a repeated Event is a patch (client-go's EventCorrelator); this run recorded each Event once"
		}
		return ""
	}
	for _, g := range unused {
		if why := mayBeUnused(g); why != "" {
			t.Logf("unused in this run: %s: %s", g, why)
			continue
		}
		t.Errorf("the chart grants %s, which kadmit watch never used", g)
	}
}
