package doctor

import (
	"errors"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func rule(groups, versions, resources []string, ops ...admissionregistrationv1.OperationType) admissionregistrationv1.RuleWithOperations {
	return admissionregistrationv1.RuleWithOperations{Operations: ops, Rule: admissionregistrationv1.Rule{APIGroups: groups, APIVersions: versions, Resources: resources}}
}

func TestRuleMatches(t *testing.T) {
	podCreate := Request{Version: "v1", Resource: "pods", Operation: "CREATE", Namespaced: true}
	podStatus := Request{Version: "v1", Resource: "pods", Subresource: "status", Operation: "UPDATE", Namespaced: true}
	nodeCreate := Request{Version: "v1", Resource: "nodes", Operation: "CREATE"}
	deployUpdate := Request{Group: "apps", Version: "v1", Resource: "deployments", Operation: "UPDATE", Namespaced: true}
	cluster, namespaced := admissionregistrationv1.ClusterScope, admissionregistrationv1.NamespacedScope
	scoped := func(r admissionregistrationv1.RuleWithOperations, s admissionregistrationv1.ScopeType) admissionregistrationv1.RuleWithOperations {
		r.Scope = &s
		return r
	}
	cases := []struct {
		name string
		rule admissionregistrationv1.RuleWithOperations
		req  Request
		want bool
	}{
		{"exact", rule([]string{""}, []string{"v1"}, []string{"pods"}, "CREATE"), podCreate, true},
		{"wrong op", rule([]string{""}, []string{"v1"}, []string{"pods"}, "UPDATE"), podCreate, false},
		{"op star", rule([]string{""}, []string{"v1"}, []string{"pods"}, "*"), podCreate, true},
		{"wrong group", rule([]string{"apps"}, []string{"v1"}, []string{"pods"}, "CREATE"), podCreate, false},
		{"group and version star", rule([]string{"*"}, []string{"*"}, []string{"pods"}, "CREATE"), podCreate, true},
		{"resource star is main resources only", rule([]string{"*"}, []string{"*"}, []string{"*"}, "*"), podStatus, false},
		{"resource star matches pods", rule([]string{"*"}, []string{"*"}, []string{"*"}, "*"), podCreate, true},
		{"star slash star matches subresources", rule([]string{"*"}, []string{"*"}, []string{"*/*"}, "*"), podStatus, true},
		{"pods does not match pods/status", rule([]string{""}, []string{"v1"}, []string{"pods"}, "*"), podStatus, false},
		{"pods/* matches pods/status", rule([]string{""}, []string{"v1"}, []string{"pods/*"}, "*"), podStatus, true},
		{"*/status matches pods/status", rule([]string{""}, []string{"v1"}, []string{"*/status"}, "*"), podStatus, true},
		// As in k8s.io/apiserver rules.Matcher: "/*" also matches the main resource.
		{"pods/* matches pods too", rule([]string{""}, []string{"v1"}, []string{"pods/*"}, "*"), podCreate, true},
		{"cluster scope excludes pods", scoped(rule([]string{"*"}, []string{"*"}, []string{"*"}, "*"), cluster), podCreate, false},
		{"cluster scope includes nodes", scoped(rule([]string{"*"}, []string{"*"}, []string{"*"}, "*"), cluster), nodeCreate, true},
		{"namespaced scope excludes nodes", scoped(rule([]string{"*"}, []string{"*"}, []string{"*"}, "*"), namespaced), nodeCreate, false},
		{"apps deployments", rule([]string{"apps"}, []string{"v1"}, []string{"deployments", "replicasets"}, "CREATE", "UPDATE"), deployUpdate, true},
	}
	for _, c := range cases {
		if got := RuleMatches([]admissionregistrationv1.RuleWithOperations{c.rule}, c.req); got != c.want {
			t.Errorf("%s: RuleMatches(%+v, %s) = %v; want %v", c.name, c.rule, c.req, got, c.want)
		}
	}
}

func TestSelectorMatches(t *testing.T) {
	sel := &metav1.LabelSelector{
		MatchLabels: map[string]string{"team": "a"},
		MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "control-plane", Operator: metav1.LabelSelectorOpDoesNotExist},
			{Key: "env", Operator: metav1.LabelSelectorOpIn, Values: []string{"prod", "stage"}},
		},
	}
	cases := []struct {
		labels map[string]string
		want   bool
	}{
		{map[string]string{"team": "a", "env": "prod"}, true},
		{map[string]string{"team": "a", "env": "dev"}, false},
		{map[string]string{"team": "a", "env": "prod", "control-plane": "x"}, false},
		{map[string]string{"env": "prod"}, false},
	}
	for _, c := range cases {
		got, err := SelectorMatches(sel, c.labels)
		if err != nil || got != c.want {
			t.Errorf("SelectorMatches(%v) = %v, %v; want %v", c.labels, got, err, c.want)
		}
	}
	if got, err := SelectorMatches(nil, nil); !got || err != nil {
		t.Errorf("nil selector = %v, %v; want match", got, err)
	}
	if got, err := SelectorMatches(&metav1.LabelSelector{}, map[string]string{"a": "b"}); !got || err != nil {
		t.Errorf("empty selector = %v, %v; want match", got, err)
	}
	bad := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Bogus"}}}
	if _, err := SelectorMatches(bad, nil); err == nil {
		t.Error("invalid operator: no error")
	}
}

func TestInterceptsUsesNamespaceSelectorOnlyForNamespaced(t *testing.T) {
	w := normalize(&Webhook{
		Rules:             []admissionregistrationv1.RuleWithOperations{rule([]string{""}, []string{"v1"}, []string{"pods", "nodes"}, "CREATE")},
		NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: metadataNameLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system"}}}},
		ObjectSelector:    &metav1.LabelSelector{MatchLabels: map[string]string{"inject": "yes"}},
	}, nil, nil, nil)
	pod := Object{Request: Request{Version: "v1", Resource: "pods", Operation: "CREATE", Namespaced: true}, Labels: map[string]string{"inject": "yes"}}
	pod.NamespaceLabels = namespaceLabels("kube-system", nil)
	if ok, _ := w.Intercepts(pod); ok {
		t.Error("pod in kube-system intercepted despite NotIn kube-system")
	}
	pod.NamespaceLabels = namespaceLabels("apps", nil)
	if ok, _ := w.Intercepts(pod); !ok {
		t.Error("pod in apps with inject=yes not intercepted")
	}
	pod.Labels = nil
	if ok, _ := w.Intercepts(pod); ok {
		t.Error("pod without inject label intercepted despite objectSelector")
	}
	node := Object{Request: Request{Version: "v1", Resource: "nodes", Operation: "CREATE"}, Labels: map[string]string{"inject": "yes"}}
	if ok, _ := w.Intercepts(node); !ok {
		t.Error("cluster-scoped node not intercepted: namespaceSelector must not apply")
	}
	if !w.Fail() || w.TimeoutSeconds != 10 {
		t.Errorf("defaults: Fail=%v timeout=%d; want Fail and 10", w.Fail(), w.TimeoutSeconds)
	}
}

func TestNamespaceExclusion(t *testing.T) {
	cases := []struct {
		name   string
		sel    *metav1.LabelSelector
		labels map[string]string
		hints  map[string]string
		want   string
		ok     bool
	}{
		{"DoesNotExist uses the pods' value (OpenKruise)",
			&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "control-plane", Operator: metav1.LabelSelectorOpDoesNotExist}}},
			nil, map[string]string{"control-plane": "controller-manager"},
			"kubectl label namespace kruise-system control-plane=controller-manager --overwrite", true},
		{"DoesNotExist without hint",
			&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "skip", Operator: metav1.LabelSelectorOpDoesNotExist}}},
			nil, nil, "kubectl label namespace kruise-system skip=true --overwrite", true},
		{"NotIn takes a listed value",
			&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "kadmit.io/ignore", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"true"}}}},
			map[string]string{"kadmit.io/ignore": "false"}, nil, "kubectl label namespace kruise-system kadmit.io/ignore=true --overwrite", true},
		{"metadata.name is skipped, next requirement used",
			&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: metadataNameLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system"}},
				{Key: "webhooks", Operator: metav1.LabelSelectorOpIn, Values: []string{"on"}},
			}},
			map[string]string{"webhooks": "on"}, nil, "kubectl label namespace kruise-system webhooks-", true},
		{"matchLabels removed",
			&metav1.LabelSelector{MatchLabels: map[string]string{"inject": "true"}},
			map[string]string{"inject": "true"}, nil, "kubectl label namespace kruise-system inject-", true},
		{"empty selector: no label helps", &metav1.LabelSelector{}, nil, nil, "", false},
		{"only metadata.name: no label helps",
			&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: metadataNameLabel, Operator: metav1.LabelSelectorOpIn, Values: []string{"kruise-system"}}}},
			nil, nil, "", false},
	}
	for _, c := range cases {
		got, ok := NamespaceExclusion(c.sel, "kruise-system", c.labels, c.hints)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: got %q, %v; want %q, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

func TestExcludeNamespacePatch(t *testing.T) {
	w := normalize(&Webhook{Kind: KindMutating, Configuration: "kruise", Index: 2}, nil, nil, nil)
	got := excludeNamespacePatch(w, "kruise-system")
	want := `kubectl patch mutatingwebhookconfiguration kruise --type=json -p '[{"op":"add","path":"/webhooks/2/namespaceSelector","value":{"matchExpressions":[{"key":"kubernetes.io/metadata.name","operator":"NotIn","values":["kruise-system"]}]}}]'`
	if got != want {
		t.Errorf("patch =\n%s\nwant\n%s", got, want)
	}
	w.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: metav1.LabelSelectorOpExists}}}
	if got := excludeNamespacePatch(w, "x"); !strings.Contains(got, `"path":"/webhooks/2/namespaceSelector/matchExpressions/-"`) {
		t.Errorf("with existing expressions the patch must append: %s", got)
	}
}

func TestFindCollision(t *testing.T) {
	lws := PodInfo{Name: "lws-1", Labels: map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "lws", "pod-template-hash": "a"}, Workload: WorkloadRef{"Deployment", "lws-controller-manager"}, Address: "198.18.0.11"}
	lws2 := lws
	lws2.Name, lws2.Address = "lws-2", "198.18.0.13"
	kueue := PodInfo{Name: "kueue-1", Labels: map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "kueue", "pod-template-hash": "b"}, Workload: WorkloadRef{"Deployment", "kueue-controller-manager"}, Address: "198.18.0.12"}

	if c := FindCollision("lws-webhook-service", []PodInfo{lws, lws2}, nil); c != nil {
		t.Fatalf("one workload: collision %+v", c)
	}
	c := FindCollision("lws-webhook-service", []PodInfo{kueue, lws, lws2}, nil)
	if c == nil {
		t.Fatal("two workloads: no collision")
	}
	if !c.Intended || c.Groups[0].Workload.Name != "lws-controller-manager" {
		t.Errorf("intended = %v %v; want lws-controller-manager first by name", c.Intended, c.Groups[0].Workload)
	}
	if c.LabelKey != "app.kubernetes.io/name" || c.LabelValue != "lws" {
		t.Errorf("label = %s=%s; want app.kubernetes.io/name=lws", c.LabelKey, c.LabelValue)
	}
	if got := strings.Join(c.Groups[0].Addresses, ","); got != "198.18.0.11,198.18.0.13" {
		t.Errorf("addresses = %s", got)
	}
	// The certificate evidence wins over the name.
	c = FindCollision("lws-webhook-service", []PodInfo{kueue, lws}, func(r WorkloadRef) bool { return r.Name == "kueue-controller-manager" })
	if c.Groups[0].Workload.Name != "kueue-controller-manager" || c.LabelValue != "kueue" {
		t.Errorf("preferred: first %v label %s; want kueue first", c.Groups[0].Workload, c.LabelValue)
	}
	// No distinguishing label: only the shared selector label and the hash.
	a := PodInfo{Name: "a", Labels: map[string]string{"control-plane": "controller-manager", "pod-template-hash": "1"}, Workload: WorkloadRef{"Deployment", "alpha"}}
	b := PodInfo{Name: "b", Labels: map[string]string{"control-plane": "controller-manager", "pod-template-hash": "2"}, Workload: WorkloadRef{"Deployment", "beta"}}
	c = FindCollision("svc", []PodInfo{a, b}, nil)
	if c == nil || c.Intended || c.LabelKey != "" {
		t.Errorf("no name match and no label: %+v", c)
	}
	// Bare pods of one app are one workload; of two apps, a collision.
	p1 := PodInfo{Name: "p1", Labels: map[string]string{"app": "x"}, Workload: WorkloadRef{"Pod", "p1"}}
	p2 := PodInfo{Name: "p2", Labels: map[string]string{"app": "x"}, Workload: WorkloadRef{"Pod", "p2"}}
	if c := FindCollision("x", []PodInfo{p1, p2}, nil); c != nil {
		t.Errorf("bare pods of one app: collision %+v", c)
	}
	p2.Labels = map[string]string{"app": "y"}
	if c := FindCollision("x", []PodInfo{p1, p2}, nil); c == nil {
		t.Error("bare pods of two apps: no collision")
	}
}

func TestClassify(t *testing.T) {
	const name = "vleaderworkerset.kb.io"
	call := `Internal error occurred: failed calling webhook "vleaderworkerset.kb.io": failed to call webhook: Post "https://lws-webhook-service.ns.svc:443/validate?timeout=10s": `
	cases := []struct {
		msg  string
		want string
	}{
		{"", IDProbeAdmitted},
		{call + "dial tcp 198.18.0.5:9443: connect: connection refused", IDProbeRefused},
		{call + "tls: failed to verify certificate: x509: certificate signed by unknown authority", IDProbeUnknownAuthority},
		{call + "tls: failed to verify certificate: x509: certificate is valid for kueue-webhook-service.ns.svc, not lws-webhook-service.ns.svc", IDProbeSANMismatch},
		{call + "tls: failed to verify certificate: x509: certificate has expired or is not yet valid: current time ...", IDProbeCertExpired},
		{call + "context deadline exceeded", IDProbeTimeout},
		{call + "net/http: request canceled (Client.Timeout exceeded while awaiting headers)", IDProbeTimeout},
		{call + `service "x" not found`, IDProbeBadResponse},
		{`Internal error occurred: failed calling webhook "vleaderworkerset.kb.io": failed to call webhook: no endpoints available for service "lws"`, IDProbeNoEndpoints},
		{`admission webhook "vleaderworkerset.kb.io" denied the request: nope`, IDProbeDenied},
		{`admission webhook "other.kb.io" denied the request: nope`, IDProbeInconclusive},
		{`Internal error occurred: failed calling webhook "other.kb.io": connection refused`, IDProbeInconclusive},
	}
	for _, c := range cases {
		var err error
		if c.msg != "" {
			err = errors.New(c.msg)
		}
		if got := Classify(err, name); got.ID != c.want {
			t.Errorf("Classify(%q) = %s (%s); want %s", c.msg, got.ID, got.Class, c.want)
		}
	}
}

func TestPlanProbe(t *testing.T) {
	none := admissionregistrationv1.SideEffectClassNone
	w := normalize(&Webhook{
		Rules:             []admissionregistrationv1.RuleWithOperations{rule([]string{""}, []string{"v1"}, []string{"pods"}, "CREATE", "UPDATE")},
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}},
		ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "inject", Operator: metav1.LabelSelectorOpIn, Values: []string{"yes"}},
			{Key: "skip", Operator: metav1.LabelSelectorOpDoesNotExist},
			{Key: "tier", Operator: metav1.LabelSelectorOpExists},
		}},
	}, nil, &none, nil)
	nss := map[string]map[string]string{"default": nil, "kube-system": {"team": "a"}, "team-a": {"team": "a"}, "b": {"team": "a"}}
	plan, why := planProbe(w, nss)
	if plan == nil {
		t.Fatalf("no plan: %s", why)
	}
	if plan.Namespace != "b" || plan.Request.Resource != "pods" {
		t.Errorf("plan = %s in %s; want pods in b (first non-kube namespace that matches)", plan.Request, plan.Namespace)
	}
	if plan.Labels["inject"] != "yes" || plan.Labels["tier"] == "" || plan.Labels["skip"] != "" {
		t.Errorf("labels = %v", plan.Labels)
	}
	some := admissionregistrationv1.SideEffectClassSome
	w.SideEffects = some
	if plan, why := planProbe(w, nss); plan != nil || !strings.Contains(why, "dry-run") {
		t.Errorf("sideEffects Some: plan %v, why %q", plan, why)
	}
	w.SideEffects = none
	w.Rules = []admissionregistrationv1.RuleWithOperations{rule([]string{"leaderworkerset.x-k8s.io"}, []string{"v1"}, []string{"leaderworkersets"}, "CREATE")}
	if plan, _ := planProbe(w, nss); plan != nil {
		t.Errorf("custom resource: plan %v; want none", plan)
	}
	w.Rules = []admissionregistrationv1.RuleWithOperations{rule([]string{""}, []string{"v1"}, []string{"nodes"}, "CREATE")}
	if plan, why := planProbe(w, nss); plan == nil || plan.Namespace != "" || plan.Request.Resource != "nodes" {
		t.Errorf("nodes: plan %v (%s)", plan, why)
	}
}
