package doctor

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
)

// depDS is a DaemonSet whose pod template has lbls, hostNetwork and the
// given hostPath volumes.
func depDS(ns, name string, lbls map[string]string, hostNetwork bool, hostPaths ...string) *appsv1.DaemonSet {
	spec := corev1.PodSpec{HostNetwork: hostNetwork, Containers: []corev1.Container{{Name: name, Image: "x"}}}
	for i, p := range hostPaths {
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "v" + string(rune('a'+i)), VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: p}}})
	}
	return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: lbls}, Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: lbls}, Spec: spec}}}
}

// depDeploy is a Deployment in ns whose pod template has lbls.
func depDeploy(ns, name string, lbls map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: lbls},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: lbls},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: lbls}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: name, Image: "x",
				Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: 9443}}}}}}}}
}

// certManager is cert-manager as its Helm chart (v1.x) labels it, release
// "cert-manager" in namespace cert-manager.
func certManager() []runtime.Object {
	l := func(name, comp string) map[string]string {
		return map[string]string{"app": name, labelName: name, labelInstance: "cert-manager", labelComponent: comp, "app.kubernetes.io/version": "v1.17.2"}
	}
	return []runtime.Object{
		depDeploy("cert-manager", "cert-manager", l("cert-manager", "controller")),
		depDeploy("cert-manager", "cert-manager-cainjector", l("cainjector", "cainjector")),
		depDeploy("cert-manager", "cert-manager-webhook", l("webhook", "webhook")),
	}
}

func depNS(name string, lbls map[string]string) *corev1.Namespace {
	l := map[string]string{metadataNameLabel: name}
	for k, v := range lbls {
		l[k] = v
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
}

func refs(ds []Dependency) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Role+" "+d.Namespace+"/"+d.Workload.String())
	}
	return out
}

// DependenciesFrom recognises CNI agents by host network plus a CNI
// hostPath in any namespace (Calico, Flannel, Cilium, MicroShift's
// OVN-Kubernetes), cluster DNS by its Service or default label, and
// cert-manager by its chart's labels; nothing else.
func TestDependenciesFrom(t *testing.T) {
	dss := []*appsv1.DaemonSet{
		depDS("calico-system", "calico-node", map[string]string{"k8s-app": "calico-node"}, true, "/lib/modules", "/opt/cni/bin", "/etc/cni/net.d", "/var/log/calico/cni"),
		depDS("kube-flannel", "kube-flannel-ds", map[string]string{"app": "flannel"}, true, "/run/flannel", "/opt/cni/bin", "/etc/cni/net.d/"),
		depDS("kube-system", "cilium", map[string]string{"k8s-app": "cilium"}, true, "/etc/cni/net.d", "/home/kubernetes/bin"),
		// MicroShift 4.x: the CNI binary goes to /run/cni/bin, the
		// configuration to /etc/cni/net.d; it also mounts the host's /.
		depDS("openshift-ovn-kubernetes", "ovnkube-master", map[string]string{"app": "ovnkube-master"}, true, "/", "/etc/cni/net.d", "/run/cni/bin"),
		// A parent directory of a CNI directory counts, / and /etc do not.
		depDS("weave", "weave-net", map[string]string{"name": "weave-net"}, true, "/opt/cni", "/etc"),
		// Not CNI agents.
		depDS("kube-system", "kube-proxy", map[string]string{"k8s-app": "kube-proxy"}, true, "/run/xtables.lock", "/lib/modules"),
		depDS("monitoring", "node-exporter", map[string]string{"app": "node-exporter"}, true, "/", "/proc", "/sys", "/etc"),
		depDS("cni-installer", "not-host-network", map[string]string{"app": "x"}, false, "/etc/cni/net.d"),
		// OpenShift DNS is a DaemonSet behind openshift-dns/dns-default.
		depDS("openshift-dns", "dns-default", map[string]string{"dns.operator.openshift.io/daemonset-dns": "default"}, false),
		nil,
	}
	deps := []*appsv1.Deployment{
		depDeploy("kube-system", "coredns", map[string]string{"k8s-app": "kube-dns"}),
		depDeploy("kube-system", "metrics-server", map[string]string{"k8s-app": "metrics-server"}),
		// k8s-app=kube-dns outside kube-system is not cluster DNS.
		depDeploy("default", "coredns-copy", map[string]string{"k8s-app": "kube-dns"}),
		// A generic "webhook" without a cert-manager controller next to it.
		depDeploy("team", "webhook", map[string]string{labelName: "webhook", labelComponent: "webhook", labelInstance: "cert-manager"}),
		nil,
	}
	for _, o := range certManager() {
		deps = append(deps, o.(*appsv1.Deployment))
	}
	want := []string{
		"cni calico-system/DaemonSet/calico-node",
		"cni kube-flannel/DaemonSet/kube-flannel-ds",
		"cni kube-system/DaemonSet/cilium",
		"cni openshift-ovn-kubernetes/DaemonSet/ovnkube-master",
		"cni weave/DaemonSet/weave-net",
		"dns kube-system/Deployment/coredns",
		"dns openshift-dns/DaemonSet/dns-default",
		"cert-issuer cert-manager/Deployment/cert-manager",
		"cert-issuer cert-manager/Deployment/cert-manager-cainjector",
		"cert-issuer cert-manager/Deployment/cert-manager-webhook",
	}
	if got := refs(DependenciesFrom(dss, deps, nil)); !slices.Equal(got, want) {
		t.Errorf("DependenciesFrom:\n got %q\nwant %q", got, want)
	}

	// The kube-dns Service's selector wins over the default label: here
	// it selects a Deployment labelled otherwise, and CoreDNS is not it.
	kubeDNS := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-dns"}, Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "rke2-coredns"}}}
	other := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "other"}, Spec: corev1.ServiceSpec{Selector: map[string]string{"k8s-app": "metrics-server"}}}
	got := refs(DependenciesFrom(nil, []*appsv1.Deployment{deps[0], depDeploy("kube-system", "rke2-coredns", map[string]string{"app": "rke2-coredns"}), deps[1]}, []*corev1.Service{nil, other, kubeDNS}))
	if !slices.Equal(got, []string{"dns kube-system/Deployment/rke2-coredns"}) {
		t.Errorf("with Service kube-system/kube-dns: %q", got)
	}
	if got := DependenciesFrom(nil, nil, nil); got != nil {
		t.Errorf("nothing: %v", got)
	}
}

// kueueMicroShift is kubernetes-sigs/kueue #4074: Kueue v0.10 on
// MicroShift 4.16, whose pod webhook (failurePolicy Fail) excludes only
// kube-system and kueue-system. MicroShift runs its CNI (OVN-Kubernetes,
// ovnkube-master with /etc/cni/net.d and /run/cni/bin) in
// openshift-ovn-kubernetes and its DNS (dns-default) in openshift-dns:
// after a restart the webhook blocks both, and Kueue's own pods need the
// pod network.
func kueueMicroShift() []runtime.Object {
	kueue := map[string]string{"control-plane": "controller-manager", labelName: "kueue"}
	hook := mutatingConfig("kueue-mutating-webhook-configuration", "mpod.kb.io", "kueue-webhook-service")
	hook.Namespace = ""
	h := &hook.Webhooks[0]
	h.ClientConfig.Service.Namespace = "kueue-system"
	h.Rules = []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"CREATE"},
		Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}}
	h.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: metadataNameLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", "kueue-system"}}}}
	dnsSvc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "openshift-dns", Name: "dns-default"}, Spec: corev1.ServiceSpec{Selector: map[string]string{"dns.operator.openshift.io/daemonset-dns": "default"}}}
	kueueSvc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "kueue-system", Name: "kueue-webhook-service"}, Spec: corev1.ServiceSpec{Selector: kueue,
		Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(9443)}}}}
	return []runtime.Object{
		depNS("kube-system", nil), depNS("kueue-system", nil), depNS("openshift-ovn-kubernetes", nil), depNS("openshift-dns", nil), depNS("openshift-service-ca", nil),
		depDeploy("kueue-system", "kueue-controller-manager", kueue), kueueSvc, hook,
		depDS("openshift-ovn-kubernetes", "ovnkube-master", map[string]string{"app": "ovnkube-master", "component": "network"}, true, "/", "/etc/cni/net.d", "/run/cni/bin", "/var/run/ovn"),
		depDS("openshift-ovn-kubernetes", "ovnkube-node", map[string]string{"app": "ovnkube-node", "component": "network"}, true, "/var/lib/openvswitch/data", "/var/run/openvswitch"),
		depDS("openshift-dns", "dns-default", map[string]string{"dns.operator.openshift.io/daemonset-dns": "default"}, false), dnsSvc,
		depDeploy("openshift-service-ca", "service-ca", map[string]string{"app": "service-ca", "service-ca": "true"}),
	}
}

func TestDependencyDeadlockKueueMicroShift(t *testing.T) {
	rep := diagnose(t, fake.NewClientset(kueueMicroShift()...))
	w := rep.Webhook("kueue-mutating-webhook-configuration", "mpod.kb.io")
	fs := w.ByID(IDDependencyDeadlock)
	if len(fs) != 2 {
		t.Fatalf("KD506: want the CNI and the DNS finding, got %+v", fs)
	}
	cni, dns := fs[0], fs[1]
	if cni.Severity != SeverityError || !strings.Contains(cni.What, "DaemonSet/ovnkube-master in namespace openshift-ovn-kubernetes") ||
		!strings.Contains(cni.What, "system:serviceaccount:kube-system:daemon-set-controller") || strings.Contains(cni.What, "ovnkube-node") {
		t.Errorf("CNI finding: %+v", cni)
	}
	if !strings.Contains(cni.Why, "kueue #4074") {
		t.Errorf("CNI why: %s", cni.Why)
	}
	if dns.Severity != SeverityWarning || !strings.Contains(dns.What, "DaemonSet/dns-default in namespace openshift-dns") {
		t.Errorf("DNS finding: %+v", dns)
	}
	// Both namespaces go into one NotIn requirement: two separate
	// patches would each be fine here (the selector has matchExpressions),
	// but one says it all.
	want := `kubectl patch mutatingwebhookconfiguration kueue-mutating-webhook-configuration --type=json -p '[{"op":"add","path":"/webhooks/0/namespaceSelector/matchExpressions/-","value":{"key":"kubernetes.io/metadata.name","operator":"NotIn","values":["openshift-dns","openshift-ovn-kubernetes"]}}]'`
	for _, f := range fs {
		if !strings.HasPrefix(f.Fix, want) {
			t.Errorf("fix %q\nwant prefix %q", f.Fix, want)
		}
	}
	// service-ca is not Kueue's issuer (no annotation): no finding for it.
	if strings.Contains(cni.What+dns.What, "service-ca") {
		t.Error("service-ca reported without an inject-cabundle annotation")
	}
}

// The fix works: with the namespaces excluded as the fix says, KD506 is
// gone.
func TestDependencyDeadlockFixApplied(t *testing.T) {
	objs := kueueMicroShift()
	for _, o := range objs {
		if c, ok := o.(*admissionregistrationv1.MutatingWebhookConfiguration); ok {
			sel := c.Webhooks[0].NamespaceSelector
			sel.MatchExpressions = append(sel.MatchExpressions, metav1.LabelSelectorRequirement{Key: metadataNameLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"openshift-dns", "openshift-ovn-kubernetes"}})
		}
	}
	w := diagnose(t, fake.NewClientset(objs...)).Webhook("kueue-mutating-webhook-configuration", "mpod.kb.io")
	if w.Has(IDDependencyDeadlock) {
		t.Errorf("KD506 after the fix: %+v", w.ByID(IDDependencyDeadlock))
	}
}

// gatekeeperCilium: a Gatekeeper-style validating webhook on pods with
// failurePolicy Fail, which exempts namespaces labelled
// admission.gatekeeper.sh/ignore (open-policy-agent/gatekeeper #4530's
// cluster restart, with the webhook instead of the generated policies),
// on a cluster running Cilium and CoreDNS in kube-system.
func gatekeeperCilium(annotations map[string]string) []runtime.Object {
	gk := map[string]string{"control-plane": "controller-manager", "gatekeeper.sh/operation": "webhook"}
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "gatekeeper-validating-webhook-configuration", Annotations: annotations},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "validation.gatekeeper.sh",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: testBundle, Service: &admissionregistrationv1.ServiceReference{Namespace: "gatekeeper-system", Name: "gatekeeper-webhook-service", Path: ptrTo("/v1/admit"), Port: ptrTo(int32(443))}},
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"CREATE", "UPDATE"},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "admission.gatekeeper.sh/ignore", Operator: metav1.LabelSelectorOpDoesNotExist}}},
		}}}
	gkSvc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "gatekeeper-system", Name: "gatekeeper-webhook-service"}, Spec: corev1.ServiceSpec{Selector: gk,
		Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(8443)}}}}
	return append([]runtime.Object{
		depNS("kube-system", nil), depNS("gatekeeper-system", map[string]string{"admission.gatekeeper.sh/ignore": "no-self-managing"}), depNS("cert-manager", nil),
		depDeploy("gatekeeper-system", "gatekeeper-controller-manager", gk), gkSvc, cfg,
		depDS("kube-system", "cilium", map[string]string{"k8s-app": "cilium"}, true, "/etc/cni/net.d", "/opt/cni/bin", "/sys/fs/bpf"),
		depDeploy("kube-system", "coredns", map[string]string{"k8s-app": "kube-dns"}),
	}, certManager()...)
}

func TestDependencyDeadlockGatekeeperKubeSystem(t *testing.T) {
	w := diagnose(t, fake.NewClientset(gatekeeperCilium(nil)...)).Webhook("gatekeeper-validating-webhook-configuration", "validation.gatekeeper.sh")
	fs := w.ByID(IDDependencyDeadlock)
	if len(fs) != 2 || fs[0].Severity != SeverityError || fs[1].Severity != SeverityWarning {
		t.Fatalf("KD506: want CNI (error) and DNS (warning): %+v", fs)
	}
	if !strings.Contains(fs[0].What, "DaemonSet/cilium in namespace kube-system") || !strings.Contains(fs[1].What, "Deployment/coredns") ||
		!strings.Contains(fs[1].What, "system:serviceaccount:kube-system:replicaset-controller") {
		t.Errorf("KD506: %+v", fs)
	}
	// The exclusion is the label Gatekeeper's selector exempts.
	for _, f := range fs {
		if f.Fix != "kubectl label namespace kube-system admission.gatekeeper.sh/ignore=true --overwrite" {
			t.Errorf("fix %q", f.Fix)
		}
	}
	// KD502 stays: KD506 names the pods, not the namespace.
	if !w.Has(IDInterceptsKubeSystem) {
		t.Error("KD502 gone")
	}
	// No issuer annotation: cert-manager is not this webhook's dependency.
	for _, f := range fs {
		if strings.Contains(f.What, "cert-manager") {
			t.Errorf("cert-manager reported without inject-ca-from: %s", f.What)
		}
	}
}

// A webhook whose caBundle cert-manager injects (inject-ca-from) and which
// intercepts cert-manager's namespace: cert-manager's three Deployments
// are its certificate issuer.
func TestDependencyDeadlockCertManager(t *testing.T) {
	for _, ann := range []map[string]string{
		{annotationInjectCAFrom: "gatekeeper-system/gatekeeper-webhook-cert"},
		{annotationInjectCAFromSecret: "gatekeeper-system/gatekeeper-webhook-server-cert"},
	} {
		w := diagnose(t, fake.NewClientset(gatekeeperCilium(ann)...)).Webhook("gatekeeper-validating-webhook-configuration", "validation.gatekeeper.sh")
		var issuer *Finding
		for _, f := range w.ByID(IDDependencyDeadlock) {
			if strings.Contains(f.What, "the pods of the certificate issuer cert-manager:") {
				issuer = &f
			}
		}
		if issuer == nil {
			t.Fatalf("%v: no certificate issuer finding: %+v", ann, w.ByID(IDDependencyDeadlock))
		}
		if issuer.Severity != SeverityError ||
			!strings.Contains(issuer.What, "Deployment/cert-manager, Deployment/cert-manager-cainjector, Deployment/cert-manager-webhook in namespace cert-manager") ||
			!strings.Contains(issuer.Why, "cert-manager (annotation cert-manager.io/inject-ca-from") ||
			issuer.Fix != "kubectl label namespace cert-manager admission.gatekeeper.sh/ignore=true --overwrite" {
			t.Errorf("%v: %+v", ann, *issuer)
		}
	}
}

// No KD506: the namespaces are excluded, the webhook is Ignore, its pods
// need no pod network, or it is not in the cluster.
func TestDependencyDeadlockNegatives(t *testing.T) {
	const cfg, hook = "gatekeeper-validating-webhook-configuration", "validation.gatekeeper.sh"
	edit := func(f func(objs []runtime.Object)) *WebhookReport {
		objs := gatekeeperCilium(map[string]string{annotationInjectCAFrom: "gatekeeper-system/cert"})
		f(objs)
		return diagnose(t, fake.NewClientset(objs...)).Webhook(cfg, hook)
	}
	each := func(objs []runtime.Object, f func(o runtime.Object)) {
		for _, o := range objs {
			f(o)
		}
	}
	// Every dependency's namespace exempt.
	w := edit(func(objs []runtime.Object) {
		each(objs, func(o runtime.Object) {
			if n, ok := o.(*corev1.Namespace); ok {
				n.Labels["admission.gatekeeper.sh/ignore"] = "yes"
			}
		})
	})
	if w.Has(IDDependencyDeadlock) {
		t.Errorf("exempt namespaces: %+v", w.ByID(IDDependencyDeadlock))
	}
	// failurePolicy Ignore.
	w = edit(func(objs []runtime.Object) {
		each(objs, func(o runtime.Object) {
			if c, ok := o.(*admissionregistrationv1.ValidatingWebhookConfiguration); ok {
				ig := admissionregistrationv1.Ignore
				c.Webhooks[0].FailurePolicy = &ig
			}
		})
	})
	if w.Has(IDDependencyDeadlock) {
		t.Errorf("Ignore: %+v", w.ByID(IDDependencyDeadlock))
	}
	// Host-network webhook pods need no CNI: only DNS and the issuer stay.
	w = edit(func(objs []runtime.Object) {
		each(objs, func(o runtime.Object) {
			if d, ok := o.(*appsv1.Deployment); ok && d.Name == "gatekeeper-controller-manager" {
				d.Spec.Template.Spec.HostNetwork = true
			}
		})
	})
	for _, f := range w.ByID(IDDependencyDeadlock) {
		if strings.Contains(f.What, "CNI") {
			t.Errorf("host-network webhook: %+v", f)
		}
	}
	if len(w.ByID(IDDependencyDeadlock)) != 2 {
		t.Errorf("host-network webhook: want DNS and issuer: %+v", w.ByID(IDDependencyDeadlock))
	}
	// A URL webhook depends on neither CNI nor DNS; its issuer still counts.
	w = edit(func(objs []runtime.Object) {
		each(objs, func(o runtime.Object) {
			if c, ok := o.(*admissionregistrationv1.ValidatingWebhookConfiguration); ok {
				c.Webhooks[0].ClientConfig.Service = nil
				c.Webhooks[0].ClientConfig.URL = ptrTo("https://gatekeeper.example.com/v1/admit")
			}
		})
	})
	if fs := w.ByID(IDDependencyDeadlock); len(fs) != 1 || !strings.Contains(fs[0].What, "certificate issuer") {
		t.Errorf("URL webhook: %+v", fs)
	}
}

// A matchCondition on the pod's spec cannot be decided on a dependency's
// stand-in (labels only): warning, saying so.
func TestDependencyDeadlockMatchConditionUnsure(t *testing.T) {
	objs := gatekeeperCilium(nil)
	for _, o := range objs {
		if c, ok := o.(*admissionregistrationv1.ValidatingWebhookConfiguration); ok {
			c.Webhooks[0].MatchConditions = []admissionregistrationv1.MatchCondition{{Name: "not-host-network", Expression: "!object.spec.hostNetwork"}}
		}
	}
	w := diagnose(t, fake.NewClientset(objs...)).Webhook("gatekeeper-validating-webhook-configuration", "validation.gatekeeper.sh")
	fs := w.ByID(IDDependencyDeadlock)
	if len(fs) == 0 {
		t.Fatal("no KD506")
	}
	for _, f := range fs {
		if f.Severity == SeverityError || !strings.Contains(f.What, "Doctor cannot tell for sure") {
			t.Errorf("unsure verdict: %+v", f)
		}
	}
}

// A refused cluster-wide list is a gap, and what the other list gave is
// still used.
func TestDependenciesAccessGap(t *testing.T) {
	cs := fake.NewClientset(gatekeeperCilium(nil)...)
	forbid(cs, "list", "apps", "daemonsets")
	snap, err := LoadSnapshot(t.Context(), cs)
	if err != nil {
		t.Fatal(err)
	}
	if snap.DependenciesKnown {
		t.Error("DependenciesKnown with DaemonSets forbidden")
	}
	if got := refs(snap.Dependencies); !slices.Contains(got, "dns kube-system/Deployment/coredns") || slices.Contains(got, "cni kube-system/DaemonSet/cilium") {
		t.Errorf("dependencies: %q", got)
	}
	found := false
	for _, g := range snap.Gaps {
		if g.Resource == "daemonsets.apps" && g.Namespace == "" && strings.Contains(g.Lost, IDDependencyDeadlock) {
			found = true
		}
	}
	if !found {
		t.Errorf("no cluster-wide DaemonSet gap: %+v", snap.Gaps)
	}
}

// Bounds: DependenciesFrom keeps MaxDependencies (CNI first), and one
// finding lists at most maxListed workloads, counting the rest.
func TestDependenciesBounds(t *testing.T) {
	var dss []*appsv1.DaemonSet
	for i := range MaxDependencies + 10 {
		dss = append(dss, depDS("zz-cni", "agent-"+strconv.Itoa(1000+i), map[string]string{"app": "agent-" + strconv.Itoa(i)}, true, "/etc/cni/net.d"))
	}
	deps := DependenciesFrom(dss, []*appsv1.Deployment{depDeploy("kube-system", "coredns", map[string]string{"k8s-app": "kube-dns"})}, nil)
	if len(deps) != MaxDependencies || deps[0].Workload.Name != "agent-1000" || deps[len(deps)-1].Role != DependencyCNI {
		t.Fatalf("%d dependencies, first %v, last %v", len(deps), deps[0].Workload, deps[len(deps)-1])
	}

	objs := gatekeeperCilium(nil)
	for i := range 7 {
		objs = append(objs, depDS("kube-system", "cni-"+strconv.Itoa(i), map[string]string{"app": "cni-" + strconv.Itoa(i)}, true, "/opt/cni/bin"))
	}
	w := diagnose(t, fake.NewClientset(objs...)).Webhook("gatekeeper-validating-webhook-configuration", "validation.gatekeeper.sh")
	cni := w.ByID(IDDependencyDeadlock)[0]
	if !strings.Contains(cni.What, "DaemonSet/cilium, DaemonSet/cni-0, DaemonSet/cni-1, DaemonSet/cni-2, DaemonSet/cni-3 and 3 more in namespace kube-system") {
		t.Errorf("listed: %s", cni.What)
	}
}
