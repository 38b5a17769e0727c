package server

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
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

// TestMetricsAuthFloodDoesNotStarveScrapers: a flood of garbage tokens
// (issue 20: a real scraper got 429 three times) spends only its own
// address's share of token reviews, and never the reviews of tokens the
// API server authenticated before, nor access reviews.
func TestMetricsAuthFloodDoesNotStarveScrapers(t *testing.T) {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
		if strings.HasPrefix(tr.Spec.Token, "scraper") {
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: tr.Spec.Token}}
		}
		return true, tr, nil
	})
	cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		sar.Status.Allowed = strings.HasPrefix(sar.Spec.User, "scraper")
		return true, sar, nil
	})
	a := newMetricsAuthorizer(cs, slog.New(slog.NewTextHandler(io.Discard, nil)), newThrottle())
	limited := map[string]int{}
	a.limited = func(scope string) { limited[scope]++ }
	now := time.Now()
	a.now = func() time.Time { return now }
	h := a.wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("metrics")) }))
	get := func(source, token string) int {
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		r.RemoteAddr = source + ":40000"
		r.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	if code := get("10.0.0.1", "scraper-a"); code != 200 {
		t.Fatalf("scraper before the flood: %d", code)
	}
	// One address floods: it gets its burst, then 429s; the global rate is
	// left for everyone else.
	codes := map[int]int{}
	for i := 0; i < 300; i++ {
		codes[get("10.0.0.66", fmt.Sprint("garbage-", i))]++
	}
	if codes[http.StatusTooManyRequests] < 250 || limited["source"] < 250 {
		t.Fatalf("one address's flood: answers %v, limited %v; want it held to its own rate", codes, limited)
	}
	if code := get("10.0.0.2", "scraper-b"); code != 200 {
		t.Fatalf("a new scraper token from another address during a one-address flood: %d", code)
	}
	// Many addresses flood: the global rate is spent, yet a scraper whose
	// cached token has expired is reviewed again at once (the API server
	// authenticated it before), and its access review is not starved.
	for i := 0; i < 300; i++ {
		get(fmt.Sprintf("10.1.%d.%d", i/200, i%200), fmt.Sprint("garbage-many-", i))
	}
	if limited["global"] == 0 {
		t.Fatalf("a many-address flood never reached the global rate: %v", limited)
	}
	now = now.Add(tokenCacheTTL + 5*time.Minute + time.Second) // token and allowance both expired
	for _, tok := range []string{"scraper-a", "scraper-b"} {
		if code := get("10.0.0.1", tok); code != 200 {
			t.Fatalf("%s after its cache entries expired, during the flood: %d", tok, code)
		}
	}
	if len(a.sources) > maxSources || len(a.known) > maxCacheEntries {
		t.Fatalf("tracked %d sources and %d known tokens", len(a.sources), len(a.known))
	}
}
