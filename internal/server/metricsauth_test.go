package server

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestMetricsAuthorizer checks the answers and the caches against a fake
// clientset; test/e2e/mtls runs the same against a real API server.
func TestMetricsAuthorizer(t *testing.T) {
	cs := fake.NewClientset()
	reviews := map[string]int{}
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		reviews["token"]++
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
		switch tr.Spec.Token {
		case "scraper", "stranger":
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: tr.Spec.Token}}
		}
		return true, tr, nil
	})
	cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		reviews["access"]++
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		na := sar.Spec.NonResourceAttributes
		sar.Status.Allowed = sar.Spec.User == "scraper" && na != nil && na.Path == "/metrics" && na.Verb == "get"
		return true, sar, nil
	})
	a := newMetricsAuthorizer(cs, slog.New(slog.NewTextHandler(io.Discard, nil)), newThrottle())
	now := time.Now()
	a.now = func() time.Time { return now }
	h := a.wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("metrics")) }))
	get := func(auth string) int {
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for _, tc := range []struct {
		auth string
		want int
	}{
		{"", 401}, {"Basic x", 401}, {"Bearer ", 401}, {"Bearer bogus", 401},
		{"Bearer stranger", 403}, {"Bearer scraper", 200}, {"bearer scraper", 200},
	} {
		if got := get(tc.auth); got != tc.want {
			t.Errorf("Authorization %q: HTTP %d, want %d", tc.auth, got, tc.want)
		}
	}
	if reviews["token"] != 3 || reviews["access"] != 2 {
		t.Fatalf("reviews sent: %v, want 3 token and 2 access (the repeated scraper request cached)", reviews)
	}
	// Denials expire after 30 s, tokens after 1 min, allowances after 5.
	now = now.Add(31 * time.Second)
	get("Bearer stranger")
	get("Bearer scraper")
	if reviews["token"] != 3 || reviews["access"] != 3 {
		t.Fatalf("after 31s: %v, want only the denial reviewed again", reviews)
	}
	now = now.Add(time.Minute)
	get("Bearer scraper")
	if reviews["token"] != 4 || reviews["access"] != 3 {
		t.Fatalf("after 91s: %v, want the token reviewed again", reviews)
	}
	// Distinct tokens cannot make kadmit flood the API server.
	codes := map[int]int{}
	for i := 0; i < 200; i++ {
		codes[get("Bearer new-"+string(rune('a'+i%26))+time.Duration(i).String())]++
	}
	if codes[http.StatusTooManyRequests] == 0 || reviews["token"] > 4+reviewBurst+5 {
		t.Fatalf("200 new tokens: answers %v, %d token reviews", codes, reviews["token"])
	}
	if len(a.tokens) > maxCacheEntries {
		t.Fatalf("token cache holds %d entries", len(a.tokens))
	}
}
