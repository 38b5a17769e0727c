package watch

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/kadmit/kadmit/internal/doctor"
	"github.com/kadmit/kadmit/internal/testkit"
)

// A watch that may not list pods and ReplicaSets runs anyway: the
// webhook's findings say what it could not read (KD001, info), and the
// owner chain it cannot follow raises no error (issue 15: a Service whose
// pods belong to one Deployment is no collision).
func TestPartialAccessIsAGapNotAnError(t *testing.T) {
	ca := newTestCA(t)
	labels := map[string]string{"app": "svc-g"}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "svc-g", Namespace: testNS},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}}}}
	r := startControllerDenying(t, map[string]bool{"pods": true, "replicasets": true}, nil,
		testService("svc-g", 9443), slice("svc-g", 9443), d, validatingConfig("cfg-g", "svc-g", false, ca.pem(), "g.example.com"))
	testkit.Eventually(t, 10*time.Second, "first evaluation", r.c.Ready)
	s := r.states()["cfg-g/g.example.com"]
	var gaps []string
	for _, f := range s.findings {
		if f.ID == doctor.IDAccessGap {
			gaps = append(gaps, f.What)
		}
		if f.Severity == doctor.SeverityError && f.ID != doctor.IDNoReadyEndpoints {
			t.Errorf("error finding with partial access: %s", f)
		}
	}
	got := strings.Join(gaps, "\n")
	if !strings.Contains(got, "could not list pods in namespace hooks (forbidden)") || !strings.Contains(got, "could not list replicasets.apps in namespace hooks (forbidden)") {
		t.Fatalf("access gaps: %q", gaps)
	}
}

// Without read access to the webhook configurations there is nothing to
// watch: Run says so instead of never becoming ready.
func TestNoAccessToConfigurationsIsAnError(t *testing.T) {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, a.(k8stesting.CreateAction).GetObject(), nil // Allowed: false
	})
	c, err := New(Options{Client: cs}, record.NewFakeRecorder(10))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Run(ctx, ""); err == nil || !strings.Contains(err.Error(), "may not list and watch mutatingwebhookconfigurations") {
		t.Fatalf("Run: %v", err)
	}
}
