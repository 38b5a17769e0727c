package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/kadmit/kadmit/internal/jsonedit"
)

// bufChain is a chain of three mutators on /m for the buffer tests: the
// first sets label one=<request name>, the second checks it sees that
// label (and, for a request named slow-*, waits for hold first), then sets
// label two; the third checks it sees both. Each checks its whole object
// against the request's object with the earlier labels applied: a buffer
// given to another review while one still reads it fails the check.
func bufChain(t *testing.T, hold <-chan struct{}, bad func(string), bounded bool) *Webhook {
	t.Helper()
	set := func(name string, before []string, wait bool) Hook {
		f := func(_ context.Context, req *Request) ([]jsonedit.Op, Verdict) {
			if wait && strings.HasPrefix(req.Name, "slow") {
				<-hold
			}
			want := chainObject(req.Name, before)
			if got := string(req.Object.Raw); got != want {
				bad(fmt.Sprintf("%s of %s saw %.120s, want %.120s", name, req.Name, got, want))
			}
			d := jsonedit.NewDoc(req.Object.Raw)
			if err := d.Set(req.Name, "metadata", "labels", name); err != nil {
				return nil, Invalid("%v", err)
			}
			return d.Ops(), Allow()
		}
		var m Mutator = MutatorFunc(f)
		if bounded {
			m = boundedMutator(f)
		}
		return Hook{Policy: name, Path: "/m", Type: Mutating, Rules: podRule, Mutator: m}
	}
	whs, err := NewWebhooks([]Hook{set("one", nil, false), set("two", []string{"one"}, true), set("three", []string{"one", "two"}, false)})
	if err != nil {
		t.Fatal(err)
	}
	return whs[0]
}

// chainObject is the pod of request name (its size varies with the name,
// so buffers are reused across objects of other sizes) with the labels
// keys set to name, as bufChain's mutators leave it.
func chainObject(name string, keys []string) string {
	var labels strings.Builder
	fmt.Fprintf(&labels, `"a":"%s"`, strings.Repeat("x", len(name)*40))
	for _, k := range keys {
		fmt.Fprintf(&labels, `,"%s":"%s"`, k, name)
	}
	return `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"` + name + `","labels":{` + labels.String() + `}},"spec":{"containers":[{"name":"c","image":"i"}]}}`
}

// chainPatch is the patch bufChain answers for request name.
func chainPatch(name string) string {
	return `[{"op":"add","path":"/metadata/labels/one","value":"` + name + `"},{"op":"add","path":"/metadata/labels/two","value":"` + name +
		`"},{"op":"add","path":"/metadata/labels/three","value":"` + name + `"}]`
}

// TestChainObjectBuffersReused: through the HTTP handler a chain's objects
// are made in reused buffers, and every mutator, in concurrent reviews of
// objects of different sizes, reads exactly the object the earlier ones
// left, while a review abandoned at its deadline keeps its buffers until
// its mutators return (they still read them): the answers are the chain's
// patches, and no mutator ever sees another review's bytes.
func TestChainObjectBuffersReused(t *testing.T) {
	t.Run("review goroutine", func(t *testing.T) { testChainObjectBuffersReused(t, false) })
	// Bounded hooks review on the request's goroutine, and reuse the
	// chain's requests too; none is abandoned (answer 200 at the end).
	t.Run("bounded", func(t *testing.T) { testChainObjectBuffersReused(t, true) })
}

func testChainObjectBuffersReused(t *testing.T, bounded bool) {
	hold := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(hold) })
	var mu sync.Mutex
	var problems []string
	bad := func(s string) { mu.Lock(); problems = append(problems, s); mu.Unlock() }
	lim := NewLimits(0, 0)
	lim.SetMaxAbandoned(4)
	h := NewHandler(bufChain(t, hold, bad, bounded), HandlerOptions{Limits: lim})

	answer := func(name, timeout string) (int, string) {
		w := serve(h, "/x?timeout="+timeout, namedReview(name, chainObject(name, nil)))
		if w.Code != http.StatusOK {
			return w.Code, w.Body.String()
		}
		var rev admissionv1.AdmissionReview
		if err := json.Unmarshal(w.Body.Bytes(), &rev); err != nil || rev.Response == nil {
			return w.Code, fmt.Sprintf("undecodable answer %s: %v", w.Body, err)
		}
		return w.Code, string(rev.Response.Patch)
	}
	// Two reviews abandoned while their second mutator waits, holding the
	// object the first made.
	for _, n := range []string{"slow-1", "slow-22"} {
		if bounded {
			break // a Bounded review cannot be abandoned: it would hold this goroutine
		}
		if code, body := answer(n, "100ms"); code != http.StatusInternalServerError {
			t.Fatalf("%s: HTTP %d %s, want 500", n, code, body)
		}
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 150 {
				name := fmt.Sprintf("p%d-%s", g, strings.Repeat("n", (i*7+g)%23))
				if code, patch := answer(name, "10s"); code != http.StatusOK || patch != chainPatch(name) {
					bad(fmt.Sprintf("%s: HTTP %d, patch %s", name, code, patch))
				}
			}
		}()
	}
	wg.Wait()
	once.Do(func() { close(hold) })
	for deadline := time.Now().Add(10 * time.Second); lim.Abandoned() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the abandoned reviews did not end: %d", lim.Abandoned())
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Fatalf("%d problems, the first: %s", len(problems), strings.Join(problems[:min(3, len(problems))], "\n"))
	}
}

// TestChainReusesObjectBuffer: a review for the HTTP handler gives the
// buffers of the objects it made back, and the next review makes its
// objects in them; on a path of Bounded hooks it reuses the requests the
// chain made as well, and on any other path never (celpolicy's request
// cache tells requests apart by address). Review, which returns the final
// object, reuses nothing.
func TestChainReusesObjectBuffer(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // a collection would empty the pool
	var seen [][]byte
	var reqs []*Request
	wh, err := NewWebhooks([]Hook{
		{Policy: "one", Path: "/m", Type: Mutating, Rules: podRule, Mutator: MutatorFunc(func(_ context.Context, req *Request) ([]jsonedit.Op, Verdict) {
			d := jsonedit.NewDoc(req.Object.Raw)
			_ = d.Set("v", "metadata", "labels", "one")
			return d.Ops(), Allow()
		})},
		{Policy: "two", Path: "/m", Type: Mutating, Rules: podRule, Mutator: MutatorFunc(func(_ context.Context, req *Request) ([]jsonedit.Op, Verdict) {
			seen, reqs = append(seen, req.Object.Raw), append(reqs, req)
			return nil, Allow()
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	req := &Request{AdmissionRequest: *mustReq(t).Request}
	req.Object.Raw = []byte(podJSON)
	// sync.Pool keeps a buffer per P: a review on another P than the
	// last one's may find none, so reuse is counted, not required each time.
	const n = 20
	for _, mode := range []reviewMode{reviewForAnswer, reviewForAnswerBounded} {
		seen, reqs = nil, nil
		for range n {
			if _, err := wh[0].review(context.Background(), req, mode); err != nil {
				t.Fatal(err)
			}
		}
		bufs, rs := 0, 0
		for i := 1; i < n; i++ {
			if slices.ContainsFunc(seen[:i], func(b []byte) bool { return sameArray(b, seen[i]) }) {
				bufs++
			}
			if slices.Contains(reqs[:i], reqs[i]) {
				rs++
			}
		}
		if bufs < n/2 {
			t.Fatalf("mode %d: %d of %d reviews made their object in a buffer an earlier one used", mode, bufs, n-1)
		}
		if wantReqs := mode == reviewForAnswerBounded; (rs >= n/2) != wantReqs || (!wantReqs && rs > 0) {
			t.Fatalf("mode %d: %d of %d reviews reused a request an earlier one made", mode, rs, n-1)
		}
	}
	last := seen[len(seen)-1]
	if _, err := wh[0].Review(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if sameArray(seen[len(seen)-1], last) || slices.Contains(reqs[:len(reqs)-1], reqs[len(reqs)-1]) {
		t.Fatalf("Review, which returns the object, made it in a pooled buffer or request")
	}
}
