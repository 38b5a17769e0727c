package doctor

import (
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
)

// termFixture is Kueue's webhook Deployment (one container "manager",
// port https 9443) behind lws-webhook-service, with its pod spec edited
// by edit, and failurePolicy fp.
func termFixture(fp admissionregistrationv1.FailurePolicyType, edit func(*corev1.PodSpec)) []runtime.Object {
	d := deployment("kueue-controller-manager", kueueLabels())
	rs := replicaSet("kueue-controller-manager", "7d9f6c4b8", kueueLabels())
	edit(&d.Spec.Template.Spec)
	edit(&rs.Spec.Template.Spec)
	pod := rsPod("kueue-controller-manager", "7d9f6c4b8", kueueLabels(), "10.244.1.5")
	edit(&pod.Spec)
	cfg := mutatingConfig("kueue-mutating-webhook-configuration", "mjob.kb.io", "lws-webhook-service")
	cfg.Webhooks[0].FailurePolicy = &fp
	return []runtime.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lwsNS}}, d, rs, pod,
		svc("lws-webhook-service", kueueLabels()), slice("lws-webhook-service", pod), cfg}
}

func kd203(t *testing.T, fp admissionregistrationv1.FailurePolicyType, edit func(*corev1.PodSpec)) []Finding {
	t.Helper()
	return diagnose(t, fake.NewClientset(termFixture(fp, edit)...)).Webhook("kueue-mutating-webhook-configuration", "mjob.kb.io").ByID(IDNoDrainOnTermination)
}

func preStop(h corev1.LifecycleHandler) func(*corev1.PodSpec) {
	return func(s *corev1.PodSpec) { s.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &h} }
}

func grace(s int64, then ...func(*corev1.PodSpec)) func(*corev1.PodSpec) {
	return func(p *corev1.PodSpec) {
		p.TerminationGracePeriodSeconds = &s
		for _, f := range then {
			f(p)
		}
	}
}

// kadmit's own chart (deploy/helm/kadmit/templates/deployment.yaml with
// the default values): preStop sleep 10, kadmit serve --shutdown-drain=12s,
// terminationGracePeriodSeconds = 10 + 30 + 5. No KD203.
func TestTerminationKadmitChart(t *testing.T) {
	chart := func(s *corev1.PodSpec) {
		g := int64(10 + 30 + 5)
		s.TerminationGracePeriodSeconds = &g
		s.Containers[0].Args = []string{"serve", "--tls=self-managed", "--addr=:9443", "--shutdown-grace=30s", "--shutdown-drain=12s", "--log-format=json"}
		s.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 10}}}
	}
	if fs := kd203(t, admissionregistrationv1.Fail, chart); len(fs) != 0 {
		t.Errorf("kadmit's chart: %+v", fs)
	}
	// The chart's Service sends port 443 to targetPort "https" by name.
	objs := termFixture(admissionregistrationv1.Fail, chart)
	for _, o := range objs {
		if sv, ok := o.(*corev1.Service); ok {
			sv.Spec.Ports[0].TargetPort = intstr.FromString("https")
		}
	}
	if fs := diagnose(t, fake.NewClientset(objs...)).Webhook("kueue-mutating-webhook-configuration", "mjob.kb.io").ByID(IDNoDrainOnTermination); len(fs) != 0 {
		t.Errorf("kadmit's chart, named targetPort: %+v", fs)
	}
	// Without its preStop the same named port is judged, and flagged.
	objs = termFixture(admissionregistrationv1.Fail, func(*corev1.PodSpec) {})
	for _, o := range objs {
		if sv, ok := o.(*corev1.Service); ok {
			sv.Spec.Ports[0].TargetPort = intstr.FromString("https")
		}
	}
	if fs := diagnose(t, fake.NewClientset(objs...)).Webhook("kueue-mutating-webhook-configuration", "mjob.kb.io").ByID(IDNoDrainOnTermination); len(fs) != 1 || fs[0].Severity != SeverityWarning {
		t.Errorf("named targetPort without preStop: %+v", fs)
	}
	// The in-process drain alone is a delay too.
	drainOnly := func(s *corev1.PodSpec) {
		s.Containers[0].Args = []string{"serve", "--shutdown-drain", "12s"}
	}
	if fs := kd203(t, admissionregistrationv1.Fail, drainOnly); len(fs) != 0 {
		t.Errorf("kadmit serve --shutdown-drain 12s: %+v", fs)
	}
}

// Kueue's manager as shipped (no preStop, default grace): a warning for
// Fail, info for Ignore; the fix adds a preStop sleep and a grace period
// that leaves the server its 30 s after it.
func TestTerminationNoPreStop(t *testing.T) {
	fs := kd203(t, admissionregistrationv1.Fail, func(*corev1.PodSpec) {})
	if len(fs) != 1 {
		t.Fatalf("KD203: %+v", fs)
	}
	f := fs[0]
	if f.Severity != SeverityWarning || !strings.Contains(f.What, `Container "manager" of Deployment/kueue-controller-manager`) || !strings.Contains(f.What, "no preStop delay") {
		t.Errorf("what: %s (%s)", f.What, f.Severity)
	}
	if !strings.Contains(f.Why, "kubernetes/kubernetes#127335") || !strings.Contains(f.Why, "several seconds") || !strings.Contains(f.Why, IDSingleReplica) {
		t.Errorf("why: %s", f.Why)
	}
	want := `kubectl -n lws-system patch deployment kueue-controller-manager --type=json -p '[{"op":"add","path":"/spec/template/spec/containers/0/lifecycle","value":{"preStop":{"sleep":{"seconds":10}}}},{"op":"add","path":"/spec/template/spec/terminationGracePeriodSeconds","value":40}]'`
	if !strings.HasPrefix(f.Fix, want) {
		t.Errorf("fix %q\nwant prefix %q", f.Fix, want)
	}
	fs = kd203(t, admissionregistrationv1.Ignore, func(*corev1.PodSpec) {})
	if len(fs) != 1 || fs[0].Severity != SeverityInfo || !strings.Contains(fs[0].Why, "failurePolicy is Ignore") {
		t.Errorf("Ignore: %+v", fs)
	}
}

// Exec hooks that sleep count; too short a delay, or one not shorter than
// the grace period, does not; a hook doctor cannot time lowers the
// severity.
func TestTerminationDelays(t *testing.T) {
	exec := func(cmd ...string) func(*corev1.PodSpec) {
		return preStop(corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: cmd}})
	}
	for _, c := range []struct {
		name     string
		edit     func(*corev1.PodSpec)
		sev      Severity // "" for no finding
		contains string
	}{
		{"sleep action", preStop(corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 15}}), "", ""},
		{"exec sleep", exec("sleep", "10"), "", ""},
		{"exec /bin/sleep", exec("/bin/sleep", "5"), "", ""},
		{"shell sleep then quit", exec("/bin/sh", "-c", "sleep 8 && nginx -s quit"), "", ""},
		{"manager's own sleep subcommand", exec("/manager", "sleep", "10"), "", ""},
		{"minutes, within the grace period", grace(90, exec("sleep", "1m")), "", ""},
		{"too short", exec("sleep", "2"), SeverityWarning, "only 2s"},
		{"not shorter than the grace period", grace(30, exec("sleep", "30")), SeverityWarning, "not less than terminationGracePeriodSeconds (30s)"},
		{"exec without sleep", exec("/bin/sh", "-c", "kill -QUIT 1"), SeverityInfo, "Doctor cannot tell for sure"},
		{"httpGet", preStop(corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/drain", Port: intstr.FromInt32(8080)}}), SeverityInfo, "cannot time"},
	} {
		fs := kd203(t, admissionregistrationv1.Fail, c.edit)
		switch {
		case c.sev == "" && len(fs) != 0:
			t.Errorf("%s: %+v", c.name, fs)
		case c.sev != "" && (len(fs) != 1 || fs[0].Severity != c.sev || !strings.Contains(fs[0].What, c.contains)):
			t.Errorf("%s: want one %s containing %q: %+v", c.name, c.sev, c.contains, fs)
		}
	}
	// Only the grace period is short: the fix raises it and leaves the hook.
	fs := kd203(t, admissionregistrationv1.Fail, grace(30, exec("sleep", "30")))
	if len(fs) != 1 || strings.Contains(fs[0].Fix, "lifecycle") || !strings.Contains(fs[0].Fix, `"path":"/spec/template/spec/terminationGracePeriodSeconds","value":60`) {
		t.Errorf("grace fix: %+v", fs)
	}
	// An existing lifecycle (postStart) keeps it: only preStop is replaced.
	fs = kd203(t, admissionregistrationv1.Fail, func(s *corev1.PodSpec) {
		s.Containers[0].Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}
	})
	if len(fs) != 1 || !strings.Contains(fs[0].Fix, `"path":"/spec/template/spec/containers/0/lifecycle/preStop"`) {
		t.Errorf("postStart kept: %+v", fs)
	}
}

// The container serving the target port is the one judged: a sidecar's
// preStop does not cover it. When no container declares the port, doctor
// speaks only if none delays.
func TestTerminationServingContainer(t *testing.T) {
	sidecar := corev1.Container{Name: "kube-rbac-proxy", Image: "x", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 8443}},
		Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 10}}}}
	fs := kd203(t, admissionregistrationv1.Fail, func(s *corev1.PodSpec) { s.Containers = append(s.Containers, sidecar) })
	if len(fs) != 1 || !strings.Contains(fs[0].What, `Container "manager"`) || fs[0].Severity != SeverityWarning {
		t.Errorf("sidecar with preStop: %+v", fs)
	}
	undeclared := func(s *corev1.PodSpec) {
		s.Containers[0].Ports = nil
		s.Containers = append(s.Containers, sidecar)
	}
	if fs := kd203(t, admissionregistrationv1.Fail, undeclared); len(fs) != 0 {
		t.Errorf("port undeclared, one container delays: %+v", fs)
	}
	noneDelays := func(s *corev1.PodSpec) {
		s.Containers[0].Ports = nil
		sc := sidecar
		sc.Lifecycle = nil
		s.Containers = append(s.Containers, sc)
	}
	fs = kd203(t, admissionregistrationv1.Fail, noneDelays)
	if len(fs) != 1 || fs[0].Severity != SeverityInfo || !strings.Contains(fs[0].What, "not known which one serves it") {
		t.Errorf("port undeclared, none delays: %+v", fs)
	}
}

// StatefulSets are patched as such; a bare pod cannot be, the fix says to
// recreate it.
func TestTerminationWorkloadKinds(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "webhook-0", Namespace: lwsNS, Labels: kueueLabels(), OwnerReferences: ctrl("StatefulSet", "webhook")},
		Spec: podSpec(), Status: corev1.PodStatus{PodIP: "10.244.1.9"}}
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "webhook", Namespace: lwsNS},
		Spec: appsv1.StatefulSetSpec{Selector: &metav1.LabelSelector{MatchLabels: kueueLabels()}, Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: kueueLabels()}, Spec: podSpec()}}}
	objs := []runtime.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lwsNS}}, sts, pod,
		svc("lws-webhook-service", kueueLabels()), slice("lws-webhook-service", pod), mutatingConfig("c", "h.example.com", "lws-webhook-service")}
	fs := diagnose(t, fake.NewClientset(objs...)).Webhook("c", "h.example.com").ByID(IDNoDrainOnTermination)
	if len(fs) != 1 || !strings.HasPrefix(fs[0].Fix, "kubectl -n lws-system patch statefulset webhook --type=json") {
		t.Errorf("StatefulSet: %+v", fs)
	}
	bare := pod.DeepCopy()
	bare.OwnerReferences = nil
	objs = []runtime.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lwsNS}}, bare,
		svc("lws-webhook-service", kueueLabels()), slice("lws-webhook-service", bare), mutatingConfig("c", "h.example.com", "lws-webhook-service")}
	fs = diagnose(t, fake.NewClientset(objs...)).Webhook("c", "h.example.com").ByID(IDNoDrainOnTermination)
	if len(fs) != 1 || !strings.HasPrefix(fs[0].Fix, "Recreate Pod/webhook-0 with lifecycle.preStop.sleep.seconds: 10") {
		t.Errorf("bare pod: %+v", fs)
	}
}

func TestExecSleep(t *testing.T) {
	for cmd, want := range map[string]time.Duration{
		"sleep 10":                       10 * time.Second,
		"/bin/sleep 2.5":                 2500 * time.Millisecond,
		"sh -c sleep 3; sleep 7":         7 * time.Second,
		"sh -c (sleep 4)":                4 * time.Second,
		"sleep 2m":                       2 * time.Minute,
		"nosleep 10":                     -1,
		"sleep":                          -1,
		"echo sleeping 5":                -1,
		"/usr/local/bin/manager sleep 9": 9 * time.Second,
	} {
		d, ok := execSleep(strings.Fields(cmd))
		if (want < 0 && ok) || (want >= 0 && (!ok || d != want)) {
			t.Errorf("%q: %s %v, want %s", cmd, d, ok, want)
		}
	}
}
