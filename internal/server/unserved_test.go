package server

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"

	"github.com/kadmit/kadmit/internal/admission"
)

// TestUnservedPathAnsweredAllowed: a path no webhook serves any more, but
// which Options.Unserved says the API server may still call (a policy just
// turned off, its configuration not yet gone from the API server's
// informer), is answered allowed with the request's uid and no patch; an
// unknown path still gets 404, and a served path its own verdict.
func TestUnservedPathAnsweredAllowed(t *testing.T) {
	var mu sync.Mutex
	called := map[string]bool{"/validate-pod": true}
	ts := start(t, Options{
		Webhooks: []*admission.Webhook{webhook(t, "deny", "/validate-pod", func(context.Context, *admission.Request) admission.Verdict {
			return admission.Deny("no")
		})},
		Unserved: func(p string) bool {
			mu.Lock()
			defer mu.Unlock()
			return called[p]
		},
	}, true)
	decide := func(path string) (int, bool, string) {
		t.Helper()
		resp, body, err := ts.post(path, reviewBody("uid-1", "p"))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			return resp.StatusCode, false, ""
		}
		var out struct {
			Response struct {
				UID     string `json:"uid"`
				Allowed bool   `json:"allowed"`
				Patch   []byte `json:"patch"`
			} `json:"response"`
		}
		if err := json.Unmarshal(body, &out); err != nil {
			t.Fatalf("%s: %v: %s", path, err, body)
		}
		if out.Response.UID != "uid-1" || len(out.Response.Patch) > 0 {
			t.Fatalf("%s: answer %s, want uid uid-1 and no patch", path, body)
		}
		return resp.StatusCode, out.Response.Allowed, out.Response.UID
	}
	if code, allowed, _ := decide("/validate-pod"); code != 200 || allowed {
		t.Fatalf("served path: HTTP %d allowed %t, want its own denial", code, allowed)
	}
	// The policy is turned off: the path is no longer served but still called.
	ts.SetWebhooks(nil)
	if code, allowed, _ := decide("/validate-pod"); code != 200 || !allowed {
		t.Fatalf("unserved but called path: HTTP %d allowed %t, want 200 allowed", code, allowed)
	}
	if code, _, _ := decide("/mutate-pod"); code != http.StatusNotFound {
		t.Fatalf("path never called: HTTP %d, want 404", code)
	}
	// The API server no longer calls it: 404 again.
	mu.Lock()
	called["/validate-pod"] = false
	mu.Unlock()
	if code, _, _ := decide("/validate-pod"); code != http.StatusNotFound {
		t.Fatalf("path no longer called: HTTP %d, want 404", code)
	}
}
