package bench

import (
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/kadmit/kadmit/internal/admission"
)

// newTrivialServer answers every review allowed, finding the uid by a byte
// search instead of decoding, so that the server costs as little as possible
// and the benchmark measures the generator.
func newTrivialServer(b *testing.B, h2 bool) *httptest.Server {
	b.Helper()
	key := []byte(`"uid":"`)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		i := bytes.Index(body, key) + len(key)
		uid := body[i : i+uidLen]
		out := make([]byte, 0, 128)
		out = append(out, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"`...)
		out = append(out, uid...)
		out = append(out, `","allowed":true}}`...)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	}))
	srv.EnableHTTP2 = h2
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	b.Cleanup(srv.Close)
	return srv
}

// BenchmarkGenerator runs the whole client (body, TLS, HTTP, checks) against
// a trivial loopback server; req/s is a lower bound on the generator's rate,
// since the server shares the CPUs.
func BenchmarkGenerator(b *testing.B) {
	for _, h2 := range []bool{false, true} {
		name := "http1"
		if h2 {
			name = "http2"
		}
		b.Run(name, func(b *testing.B) {
			srv := newTrivialServer(b, h2)
			o := Options{
				URL:         srv.URL + "/validate",
				RootCAs:     srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs,
				Concurrency: 4 * runtime.GOMAXPROCS(0),
				Requests:    int64(b.N),
				HTTP2:       h2,
			}
			b.ResetTimer()
			rep, err := Run(b.Context(), o)
			if err != nil {
				b.Fatal(err)
			}
			if rep.ErrorCount() != 0 {
				b.Fatalf("errors: %v", rep.Errors)
			}
			b.ReportMetric(rep.Throughput(), "req/s")
		})
	}
}

// BenchmarkRequestCPU is the generator's own work per request without the
// network: a fresh uid, the spliced body, and the check of a typical answer.
func BenchmarkRequestCPU(b *testing.B) {
	tmpl, err := newTemplate(DefaultPod(), admission.APIVersionV1, admissionv1.Create)
	if err != nil {
		b.Fatal(err)
	}
	r := &runner{tmpl: tmpl}
	g := newUIDGen()
	b.ReportAllocs()
	for b.Loop() {
		uid := g.next()
		body := tmpl.body(uid)
		answer := append(append([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"`), uid...), `","allowed":true}}`...)
		if len(body) == 0 || r.check(answer, uid) != kindOK {
			b.Fatal("bad answer")
		}
	}
}
