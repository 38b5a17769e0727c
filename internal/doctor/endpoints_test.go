package doctor

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// KD201 says why no endpoint is ready. A Service that selects no pod has,
// on a real cluster, a placeholder EndpointSlice without ports: that is
// "no pod selected", not a port-name problem (seed 004 read "its
// EndpointSlices carry no port named "https" (... 0 pod(s) selected)").
func TestNoReadyEndpointSays(t *testing.T) {
	lbls := map[string]string{"app.kubernetes.io/name": "kruise", "control-plane": "controller-manager"}
	placeholder := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "kruise-webhook-service-abcde", Namespace: lwsNS,
		Labels: map[string]string{discoveryv1.LabelServiceName: "kruise-webhook-service"}}, AddressType: discoveryv1.AddressTypeIPv4}
	pod := rsPod("kruise-controller-manager", "6d8f9c7b5", lbls, "10.0.0.9")
	renamed := slice("kruise-webhook-service", pod)
	renamed.Ports[0].Name = ptrTo("webhook")
	notReady := slice("kruise-webhook-service", pod)
	notReady.Endpoints[0].Conditions.Ready = ptrTo(false)
	base := func() []runtime.Object {
		return []runtime.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lwsNS}}, deployment("kruise-controller-manager", lbls),
			svc("kruise-webhook-service", lbls), mutatingConfig("kruise", "mpod.kb.io", "kruise-webhook-service")}
	}
	for _, c := range []struct {
		name      string
		objs      []runtime.Object
		want, not []string
	}{
		{"no pod, placeholder slice", []runtime.Object{placeholder},
			[]string{`no pod is selected (selector "app.kubernetes.io/name=kruise,control-plane=controller-manager" matches no pod in lws-system; Deployment/kruise-controller-manager runs none)`, "reason=FailedCreate"},
			[]string{"port named", "not ready"}},
		{"pod, slice port renamed", []runtime.Object{pod, replicaSet("kruise-controller-manager", "6d8f9c7b5", lbls), renamed},
			[]string{`list 1 endpoint(s) but carry no port named "https"`, "get endpointslices"},
			[]string{"no pod is selected"}},
		{"pod not ready", []runtime.Object{pod, replicaSet("kruise-controller-manager", "6d8f9c7b5", lbls), notReady},
			[]string{"its 1 endpoint(s) are all not ready (webhook pods not ready; 1 pod(s) selected)", "describe pods -l"},
			[]string{"port named", "no pod is selected"}},
		{"pod, not in a slice yet", []runtime.Object{pod, replicaSet("kruise-controller-manager", "6d8f9c7b5", lbls), placeholder},
			[]string{"no pod is ready (1 pod(s) selected, none in its EndpointSlices yet"},
			[]string{"port named"}},
	} {
		rep := diagnose(t, fake.NewClientset(append(base(), c.objs...)...))
		w := rep.Webhook("kruise", "mpod.kb.io")
		if w == nil || !w.Has(IDNoReadyEndpoints) {
			t.Errorf("%s: no KD201: %+v", c.name, w)
			continue
		}
		f := w.ByID(IDNoReadyEndpoints)[0]
		text := f.What + "\n" + f.Fix
		for _, s := range c.want {
			if !strings.Contains(text, s) {
				t.Errorf("%s: KD201 lacks %q:\n%s", c.name, s, text)
			}
		}
		for _, s := range c.not {
			if strings.Contains(text, s) {
				t.Errorf("%s: KD201 says %q:\n%s", c.name, s, text)
			}
		}
	}
}
