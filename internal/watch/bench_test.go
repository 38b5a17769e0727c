package watch

import (
	"context"
	"fmt"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
)

// BenchmarkEvaluate measures one evaluation (snapshot from the listers,
// doctor.Diagnose with cached handshakes, confirmation, states) over 100
// configurations of 2 webhooks, each Service with 3 pods of one
// Deployment. go test -bench Evaluate -run ^$ ./internal/watch/
func BenchmarkEvaluate(b *testing.B) {
	ca := newTestCA(&testing.T{})
	objs := []runtime.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}}}
	for i := range 100 {
		svc := fmt.Sprintf("svc-%03d", i)
		labels := map[string]string{"app": svc}
		objs = append(objs, testService(svc, 9443), slice(svc, 9443, "10.0.0.1", "10.0.0.2", "10.0.0.3"),
			&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: svc, Namespace: testNS},
				Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}}}},
			validatingConfig("cfg-"+svc, svc, true, ca.pem(), "a.example.com", "b.example.com"))
		for p := range 3 {
			objs = append(objs, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", svc, p), Namespace: testNS, Labels: labels}})
		}
	}
	c, err := New(Options{Client: fake.NewClientset(objs...), Dial: loopbackDial}, record.NewFakeRecorder(1))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := c.cl.register(map[string]bool{}, func() {}); err != nil {
		b.Fatal(err)
	}
	c.cl.start(ctx)
	if err := c.cl.waitSynced(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		states, _, err := c.evaluate(ctx)
		if err != nil || len(states) != 200 {
			b.Fatalf("%d states, %v", len(states), err)
		}
	}
}
