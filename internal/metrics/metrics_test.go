package metrics

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kadmit/kadmit/internal/admission"
)

func newMetrics(t *testing.T) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

func TestObserve(t *testing.T) {
	m, reg := newMetrics(t)
	m.Observe(admission.Decision{Webhook: "/validate-pod", Operation: "CREATE", HTTPCode: 200, Allowed: true, Latency: time.Millisecond})
	m.Observe(admission.Decision{Webhook: "/validate-pod", Operation: "CREATE", HTTPCode: 200, Allowed: true, Latency: 2 * time.Millisecond})
	m.Observe(admission.Decision{Webhook: "/validate-pod", Operation: "CREATE", HTTPCode: 200, Allowed: false, ResultCode: 403})
	// No decision: allowed is "", whatever Allowed says.
	m.Observe(admission.Decision{Webhook: "/mutate-pod", Operation: "", HTTPCode: 400, Allowed: true})
	m.Observe(admission.Decision{Webhook: "/mutate-pod", Operation: "CREATE", HTTPCode: 500,
		Panic: &admission.PanicError{Policy: "lifespan", Value: "boom"}})

	want := `
# HELP kadmit_admission_requests_total AdmissionReview requests answered, by webhook path, operation, decision and HTTP status code.
# TYPE kadmit_admission_requests_total counter
kadmit_admission_requests_total{allowed="",code="400",operation="",webhook="/mutate-pod"} 1
kadmit_admission_requests_total{allowed="",code="500",operation="CREATE",webhook="/mutate-pod"} 1
kadmit_admission_requests_total{allowed="false",code="200",operation="CREATE",webhook="/validate-pod"} 1
kadmit_admission_requests_total{allowed="true",code="200",operation="CREATE",webhook="/validate-pod"} 2
# HELP kadmit_admission_panics_total Policy panics recovered and answered with HTTP 500.
# TYPE kadmit_admission_panics_total counter
kadmit_admission_panics_total{policy="lifespan",webhook="/mutate-pod"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kadmit_admission_requests_total", "kadmit_admission_panics_total"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "kadmit_admission_duration_seconds"); err != nil || n != 3 {
		t.Fatalf("duration series: %d, %v; want 3 (validate-pod CREATE, mutate-pod \"\", mutate-pod CREATE)", n, err)
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues("/validate-pod", "CREATE", "true", "200")); got != 2 {
		t.Fatalf("allowed count %v", got)
	}
	h, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range h {
		if mf.GetName() != "kadmit_admission_duration_seconds" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			if lbl := mt.GetLabel(); lbl[0].GetValue() == "CREATE" && lbl[1].GetValue() == "/validate-pod" {
				found = true
				if c, s := mt.GetHistogram().GetSampleCount(), mt.GetHistogram().GetSampleSum(); c != 3 || s < 0.003-1e-9 || s > 0.003+1e-9 {
					t.Fatalf("validate-pod latency: count %d sum %v, want 3 and 0.003", c, s)
				}
			}
		}
	}
	if !found {
		t.Fatal("no latency series for /validate-pod CREATE")
	}
}

func TestNewRefusesDoubleRegistration(t *testing.T) {
	_, reg := newMetrics(t)
	if _, err := New(reg); err == nil {
		t.Fatal("registering twice on one registry succeeded")
	}
}

func TestInFlight(t *testing.T) {
	m, _ := newMetrics(t)
	g := m.inFlight.WithLabelValues("/validate-pod")
	var during float64
	h := m.InFlight("/validate-pod", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		during = testutil.ToFloat64(g)
		w.WriteHeader(http.StatusTeapot)
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/validate-pod", nil))
	if w.Code != http.StatusTeapot || during != 1 || testutil.ToFloat64(g) != 0 {
		t.Fatalf("code %d, in flight during %v, after %v", w.Code, during, testutil.ToFloat64(g))
	}
	// The gauge drops back even when the handler panics.
	p := m.InFlight("/validate-pod", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	func() {
		defer func() { _ = recover() }()
		p.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/validate-pod", nil))
	}()
	if got := testutil.ToFloat64(g); got != 0 {
		t.Fatalf("in flight after panic: %v", got)
	}
}

func TestClosedLabelSets(t *testing.T) {
	for in, want := range map[string]string{"CREATE": "CREATE", "UPDATE": "UPDATE", "DELETE": "DELETE", "CONNECT": "CONNECT", "": "", "create": "other", "OP-1": "other"} {
		if got := Operation(in); got != want {
			t.Errorf("Operation(%q) = %q, want %q", in, got, want)
		}
	}
	if Code(200) != "200" || Code(503) != "503" || Code(418) != "other" {
		t.Errorf("Code: %q %q %q", Code(200), Code(503), Code(418))
	}
}
