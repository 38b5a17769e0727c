package watch

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/internal/testkit"
)

// A caBundle without the CA of the Secret cert-manager injects from is
// KD411 once seen in two rounds (not in the first: the cainjector may be
// about to update it); a refused Secret read is a KD001 info finding,
// never an error; a matching bundle raises nothing.
func TestInjectionSource(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	secret := func(name string, c *testCA) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS}, Data: map[string][]byte{"ca.crt": c.pem()}}
	}
	stale := validatingConfig("cfg-stale", "svc-i", false, other.pem(), "stale.example.com")
	stale.Annotations = map[string]string{annInjectFromSecret: testNS + "/ca"}
	good := validatingConfig("cfg-good", "svc-i", false, ca.pem(), "good.example.com")
	good.Annotations = map[string]string{annInjectFromSecret: testNS + "/ca"}
	locked := validatingConfig("cfg-locked", "svc-i", false, ca.pem(), "locked.example.com")
	locked.Annotations = map[string]string{annInjectFromSecret: testNS + "/locked"}
	refuse := func(cs *fake.Clientset) {
		cs.PrependReactor("get", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.(k8stesting.GetAction).GetName() == "locked" {
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "locked", nil)
			}
			return false, nil, nil
		})
	}
	r := startControllerWith(t, refuse, nil, func(o *Options) { o.HandshakeInterval = time.Hour }, testService("svc-i", 9443), secret("ca", ca), secret("locked", ca), stale, good, locked)
	testkit.Eventually(t, 10*time.Second, "first evaluation", r.c.Ready)
	in := &injector{c: r.c, pending: map[wkey]bool{}}
	ctx := context.Background()
	k := func(cfg, hook string) wkey { return wkey{doctor.KindValidating, cfg, hook} }
	first := in.round(ctx)
	if len(first[k("cfg-stale", "stale.example.com")]) != 0 {
		t.Fatalf("mismatch reported in its first round: %v", first)
	}
	second := in.round(ctx)
	fs := second[k("cfg-stale", "stale.example.com")]
	if len(fs) != 1 || fs[0].ID != IDInjectMismatch || fs[0].Severity != doctor.SeverityWarning {
		t.Fatalf("stale bundle after two rounds: %+v", fs)
	}
	if fs := second[k("cfg-good", "good.example.com")]; len(fs) != 0 {
		t.Fatalf("matching bundle: %+v", fs)
	}
	fs = second[k("cfg-locked", "locked.example.com")]
	if len(fs) != 1 || fs[0].ID != doctor.IDAccessGap || fs[0].Severity != doctor.SeverityInfo {
		t.Fatalf("refused Secret: %+v", fs)
	}
}
