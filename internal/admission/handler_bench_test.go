package admission_test

// Benchmarks of the HTTP handler path per built-in policy, on the objects
// `kadmit bench` sends: run with
//
//	go test -run '^$' -bench . -benchmem ./internal/admission
//
// They measure the handler without TLS, the network or logging, so they show
// what kadmit itself adds per request (decode, policy, patch, encode).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/fixture"
	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/koordinator/colocation"
	"github.com/kadmit/kadmit/internal/policy/seed/lifespan"
	"github.com/kadmit/kadmit/internal/policy/seed/nodeovercommit"
	"github.com/kadmit/kadmit/internal/policy/seed/podname"
	"github.com/kadmit/kadmit/internal/testkit"
)

// benchPodJSON is fixture.DeploymentPodJSON(), `kadmit bench`'s default
// pod (about 4.6 KB).
func benchPodJSON(tb testing.TB) []byte {
	tb.Helper()
	return fixture.DeploymentPodJSON()
}

// benchNodeJSON is testdata/node.json compacted (about 3.6 KB): a kubelet's
// node with raw capacity and allocatable, as sent on CREATE.
func benchNodeJSON(tb testing.TB) []byte {
	tb.Helper()
	b, err := os.ReadFile("testdata/node.json")
	if err != nil {
		tb.Fatal(err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// reviewFor wraps object in an AdmissionReview v1 CREATE request for
// resource (e.g. "pods") as the API server sends it.
func reviewFor(tb testing.TB, kind, resource string, object []byte) []byte {
	tb.Helper()
	req := testkit.Request(admissionv1.Create, metav1.GroupVersionResource{Version: "v1", Resource: resource}, object, nil,
		testkit.Kind(metav1.GroupVersionKind{Version: "v1", Kind: kind}), testkit.Requested(),
		testkit.UID("705ab4f5-6393-11e8-b7cc-42010a800002"), testkit.Name("x"), testkit.Namespace("shop"))
	req.UserInfo = authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:replicaset-controller",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"}}
	req.Options = runtime.RawExtension{Raw: []byte(`{"kind":"CreateOptions","apiVersion":"meta.k8s.io/v1"}`)}
	return testkit.ReviewBody(req)
}

// seedWebhooks returns the seed profile's webhooks by path.
func seedWebhooks(tb testing.TB) map[string]*admission.Webhook {
	tb.Helper()
	pn, err := podname.New(podname.DefaultConfig())
	if err != nil {
		tb.Fatal(err)
	}
	ls, err := lifespan.New(lifespan.DefaultConfig())
	if err != nil {
		tb.Fatal(err)
	}
	no, err := nodeovercommit.New(nodeovercommit.DefaultConfig())
	if err != nil {
		tb.Fatal(err)
	}
	hooks := append(append(pn.Hooks(), ls.Hooks()...), no.Hooks()...)
	whs, err := admission.NewWebhooks(hooks)
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]*admission.Webhook{}
	for _, wh := range whs {
		out[wh.Path] = wh
	}
	return out
}

type benchCase struct {
	path string
	body []byte
}

// serve posts each case once per iteration and fails on anything but an
// allowed 200 answer, so a broken fast path cannot look fast.
func serve(b *testing.B, cases []benchCase) {
	whs := seedWebhooks(b)
	handlers := make([]http.Handler, len(cases))
	var size int64
	for i, c := range cases {
		handlers[i] = admission.NewHandler(whs[c.path], admission.HandlerOptions{})
		size += int64(len(c.body))
	}
	b.SetBytes(size)
	b.ReportAllocs()
	rd := bytes.NewReader(nil)
	w := &benchWriter{header: http.Header{}}
	for b.Loop() {
		for i, c := range cases {
			rd.Reset(c.body)
			r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, c.path+"?timeout=10s", rd)
			r.Header.Set("Content-Type", "application/json")
			w.reset()
			handlers[i].ServeHTTP(w, r)
			if w.code != http.StatusOK || !bytes.Contains(w.body.Bytes(), []byte(`"allowed":true`)) {
				b.Fatalf("%s: %d %s", c.path, w.code, w.body.String())
			}
		}
	}
}

// serveWebhook is serve for one webhook built by the caller.
func serveWebhook(b *testing.B, wh *admission.Webhook, body []byte) {
	h := admission.NewHandler(wh, admission.HandlerOptions{})
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	rd := bytes.NewReader(nil)
	w := &benchWriter{header: http.Header{}}
	for b.Loop() {
		rd.Reset(body)
		r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, wh.Path+"?timeout=10s", rd)
		r.Header.Set("Content-Type", "application/json")
		w.reset()
		h.ServeHTTP(w, r)
		if w.code != http.StatusOK || !bytes.Contains(w.body.Bytes(), []byte(`"allowed":true`)) || !bytes.Contains(w.body.Bytes(), []byte(`"patch":`)) {
			b.Fatalf("%s: %d %s", wh.Path, w.code, w.body.String())
		}
	}
}

// benchWriter is a reusable http.ResponseWriter, so the benchmark does not
// count a recorder's allocations as the handler's.
type benchWriter struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (w *benchWriter) reset() {
	clear(w.header)
	w.code = 0
	w.body.Reset()
}

func (w *benchWriter) Header() http.Header { return w.header }

func (w *benchWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *benchWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(p)
}

func BenchmarkServeHTTP_ValidatePod(b *testing.B) {
	serve(b, []benchCase{{podname.Path, reviewFor(b, "Pod", "pods", benchPodJSON(b))}})
}

func BenchmarkServeHTTP_MutatePod(b *testing.B) {
	serve(b, []benchCase{{lifespan.Path, reviewFor(b, "Pod", "pods", benchPodJSON(b))}})
}

// realisticPodJSON is the bench pod with the lifespan label "3", as `make
// bench` sends it by default (issue 14): lifespan adds twelve tolerations
// after the two DefaultTolerationSeconds ones the pod has.
func realisticPodJSON(tb testing.TB) []byte {
	tb.Helper()
	pod := benchPodJSON(tb)
	doc := jsonedit.NewDoc(pod)
	if err := doc.Set("3", "metadata", "labels", lifespan.LabelRequested); err != nil {
		tb.Fatal(err)
	}
	out, err := jsonedit.Apply(pod, doc.Ops())
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// BenchmarkServeHTTP_MutatePodRealistic is /mutate-pod on the realistic
// pod: a patch of twelve operations.
func BenchmarkServeHTTP_MutatePodRealistic(b *testing.B) {
	serve(b, []benchCase{{lifespan.Path, reviewFor(b, "Pod", "pods", realisticPodJSON(b))}})
}

func BenchmarkServeHTTP_MutateNodeStatus(b *testing.B) {
	serve(b, []benchCase{{nodeovercommit.MutatePath, reviewFor(b, "Node", "nodes", benchNodeJSON(b))}})
}

// colocationProfiles are n profiles, each stamping its own label and
// annotation; the first also sets the scheduler, a toleration and a node
// selector entry. The first matching of them select the bench pod (by its
// team label), the others select other teams. With every profile matching,
// this is colocation's worst case per pod.
func colocationProfiles(n, matching int) []colocation.Profile {
	out := make([]colocation.Profile, n)
	for i := range out {
		team := "payments"
		if i >= matching {
			team = fmt.Sprintf("team-%d", i)
		}
		out[i] = colocation.Profile{
			Name:        fmt.Sprintf("profile-%d", i),
			Selector:    &metav1.LabelSelector{MatchLabels: map[string]string{"team": team}},
			Labels:      map[string]string{fmt.Sprintf("colocation.example.com/p%d", i): "on"},
			Annotations: map[string]string{fmt.Sprintf("colocation.example.com/p%d", i): "applied"},
		}
	}
	out[0].SchedulerName = "koord-scheduler"
	out[0].Tolerations = []corev1.Toleration{{Key: "colocation", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	out[0].NodeSelector = map[string]string{"node-pool": "mixed"}
	return out
}

// BenchmarkServeHTTP_MutatePodColocation is /mutate-pod with lifespan and
// colocation with 10 profiles, one of which matches the pod: two mutators
// in a chain, the second seeing the first's output.
func BenchmarkServeHTTP_MutatePodColocation(b *testing.B) {
	benchColocation(b, 1)
}

// BenchmarkServeHTTP_MutatePodColocationAllMatch is the same with all 10
// profiles matching: 23 more operations, colocation's worst case.
func BenchmarkServeHTTP_MutatePodColocationAllMatch(b *testing.B) {
	benchColocation(b, 10)
}

// BenchmarkServeHTTP_MutatePodColocationRealistic is `make bench`'s "kadmit
// +10 colocation" row in process: the realistic pod (lifespan adds twelve
// tolerations) and benchrun's ten profiles, each adding a label and a
// toleration, the first selecting the pod.
func BenchmarkServeHTTP_MutatePodColocationRealistic(b *testing.B) {
	ps := make([]colocation.Profile, 10)
	for i := range ps {
		team := "payments"
		if i > 0 {
			team = fmt.Sprintf("nobody-%d", i)
		}
		ps[i] = colocation.Profile{
			Name:        fmt.Sprintf("p%d", i),
			Selector:    &metav1.LabelSelector{MatchLabels: map[string]string{"team": team}},
			Labels:      map[string]string{fmt.Sprintf("colocation.kadmit.io/p%d", i): "true"},
			Tolerations: []corev1.Toleration{{Key: fmt.Sprintf("colocation-p%d", i), Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		}
	}
	serveChain(b, ps, realisticPodJSON(b))
}

func benchColocation(b *testing.B, matching int) {
	serveChain(b, colocationProfiles(10, matching), benchPodJSON(b))
}

// serveChain serves pod on /mutate-pod with lifespan then colocation with
// profiles.
func serveChain(b *testing.B, profiles []colocation.Profile, pod []byte) {
	ls, err := lifespan.New(lifespan.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	co, err := colocation.New(colocation.Config{Profiles: profiles, DisableValidation: true}, nil)
	if err != nil {
		b.Fatal(err)
	}
	whs, err := admission.NewWebhooks(append(ls.Hooks(), co.Hooks()...))
	if err != nil || len(whs) != 1 {
		b.Fatalf("webhooks %v: %v", whs, err)
	}
	serveWebhook(b, whs[0], reviewFor(b, "Pod", "pods", pod))
}

// BenchmarkServeHTTP_AllPolicies sends, per iteration, the pod to both pod
// paths and the node to both node paths of the seed profile: 4 requests.
func BenchmarkServeHTTP_AllPolicies(b *testing.B) {
	pod := reviewFor(b, "Pod", "pods", benchPodJSON(b))
	node := reviewFor(b, "Node", "nodes", benchNodeJSON(b))
	serve(b, []benchCase{
		{podname.Path, pod}, {lifespan.Path, pod},
		{nodeovercommit.MutatePath, node}, {nodeovercommit.ValidatePath, node},
	})
}

// BenchmarkDecodeReview is the envelope decode alone, on the pod review.
func BenchmarkDecodeReview(b *testing.B) {
	body := reviewFor(b, "Pod", "pods", benchPodJSON(b))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := admission.DecodeReview(body); err != nil {
			b.Fatal(err)
		}
	}
}
