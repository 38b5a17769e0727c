package doctor

import (
	"context"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// BenchmarkEvalConditions: one representative request through the API
// server's matcher, for a webhook with Kyverno-style exclusions (the cost
// doctor pays per object per webhook in the interception checks).
func BenchmarkEvalConditions(b *testing.B) {
	w := podHook(true,
		mc("exclude-namespaces", `!(request.namespace in ["kyverno", "kube-system", "kube-node-lease"])`),
		mc("exclude-nodes", `!("system:nodes" in request.userInfo.groups)`),
		mc("exclude-own-sa", `!has(object.spec) || !has(object.spec.serviceAccountName) || object.spec.serviceAccountName != "kyverno-admission-controller"`))
	obj := Object{Request: Request{Version: "v1", Resource: "pods", Operation: "CREATE", Namespaced: true}, Kind: "Pod",
		Namespace: "team-a", Labels: map[string]string{"app": "x"}, User: replicaSetController, Body: podBody(corev1.PodSpec{ServiceAccountName: "default"})}
	ctx := context.Background()
	w.EvalConditions(ctx, obj) // compile once, as doctor does
	b.ReportAllocs()
	for b.Loop() {
		if !w.EvalConditions(ctx, obj).Matches {
			b.Fatal("want match")
		}
	}
}

// BenchmarkParseErrorAtBound: the worst input --from-error accepts.
func BenchmarkParseErrorAtBound(b *testing.B) {
	tail := callError("x.example.com", "https://s.n.svc:443/", dialErr("10.0.0.1:443", syscall.ECONNREFUSED))
	msg := strings.Repeat(`failed calling webhook "`, (MaxErrorMessage-len(tail))/24) + tail
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		if _, err := ParseError(msg); err != nil {
			b.Fatal(err)
		}
	}
}
