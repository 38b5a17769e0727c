package admission

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/jsonedit"
)

// groupMember is a GroupMutator of group key: a run sets label
// "<name>" for each member, in one MutateGroup call, recorded in runs.
type groupMember struct {
	key, name string
	verdict   Verdict
	panics    bool
	runs      *[][]string
}

func (m groupMember) Mutate(ctx context.Context, req *Request) ([]jsonedit.Op, Verdict) {
	panic("a group member is run through MutateGroup")
}

func (m groupMember) MutatorGroup() any { return m.key }

func (m groupMember) MutateGroup(_ context.Context, req *Request, run []Mutator, enter func(int), verdict func(int, Verdict) bool) []jsonedit.Op {
	var names []string
	d := jsonedit.NewDoc(req.Object.Raw)
	for i, r := range run {
		g := r.(groupMember)
		names = append(names, g.name)
		enter(i)
		if g.panics {
			*m.runs = append(*m.runs, names)
			panic("boom")
		}
		if err := d.Set("x", "metadata", "labels", g.name); err != nil {
			panic(err)
		}
		if !verdict(i, g.verdict) {
			break
		}
	}
	*m.runs = append(*m.runs, names)
	return d.Ops()
}

// The chain hands a GroupMutator the run of matched hooks of its group
// that follow each other: a hook of another group, or a plain mutator,
// ends it (and sees its result); a hook that does not match the request
// does not. Verdicts are folded under each member's own name: the first
// denial ends the chain naming its member, a review without decision is
// its member's, a panic is charged to the member running.
func TestChainGroupsRuns(t *testing.T) {
	var runs [][]string
	member := func(key, name string) Hook {
		return Hook{Policy: name, Path: "/m", Type: Mutating, Rules: podRule,
			Mutator: groupMember{key: key, name: name, verdict: Allow("w-" + name), runs: &runs}}
	}
	var sawPlain string
	plain := Hook{Policy: "plain", Path: "/m", Type: Mutating, Rules: podRule, Mutator: MutatorFunc(func(_ context.Context, req *Request) ([]jsonedit.Op, Verdict) {
		sawPlain = string(req.Object.Raw)
		return nil, Allow()
	})}
	unmatched := member("A", "unmatched")
	unmatched.Rules = nil
	req := &Request{AdmissionRequest: *mustReq(t).Request}
	req.Object.Raw = []byte(podJSON)

	whs, err := NewWebhooks([]Hook{member("A", "a1"), unmatched, member("A", "a2"), plain, member("A", "a3"), member("B", "b1"), member("A", "a4")})
	if err != nil {
		t.Fatal(err)
	}
	out, err := whs[0].Review(context.Background(), req)
	if err != nil || !out.Response.Allowed {
		t.Fatal(err, out.Response)
	}
	if got := fmt.Sprint(runs); got != "[[a1 a2] [a3] [b1] [a4]]" {
		t.Errorf("runs %s, want [[a1 a2] [a3] [b1] [a4]]", got)
	}
	if !strings.Contains(sawPlain, `"a1":"x"`) || !strings.Contains(sawPlain, `"a2":"x"`) || strings.Contains(sawPlain, "a3") {
		t.Errorf("the plain mutator saw %s", sawPlain)
	}
	for _, l := range []string{"a1", "a2", "a3", "b1", "a4"} {
		if !strings.Contains(string(out.Object), `"`+l+`":"x"`) {
			t.Errorf("object %s lacks label %s", out.Object, l)
		}
	}
	if out.Matched != 6 || strings.Join(out.Response.Warnings, ",") != "w-a1,w-a2,w-a3,w-b1,w-a4" {
		t.Errorf("matched %d, warnings %q", out.Matched, out.Response.Warnings)
	}

	runs = nil
	deny := member("A", "denies")
	deny.Mutator = groupMember{key: "A", name: "denies", verdict: Deny("no"), runs: &runs}
	whs, err = NewWebhooks([]Hook{member("A", "a1"), deny, member("A", "a2"), plain})
	if err != nil {
		t.Fatal(err)
	}
	sawPlain = ""
	out, err = whs[0].Review(context.Background(), req)
	if err != nil || out.Response.Allowed || out.Policy != "denies" || out.Patch != nil || sawPlain != "" || fmt.Sprint(runs) != "[[a1 denies]]" {
		t.Errorf("denial in a run: %v, policy %q, patch %v, plain saw %q, runs %v", err, out.Policy, out.Patch, sawPlain, runs)
	}

	busy := member("A", "busy")
	busy.Mutator = groupMember{key: "A", name: "busy", verdict: Unanswered(503, errors.New("full")), runs: &runs}
	whs, _ = NewWebhooks([]Hook{member("A", "a1"), busy})
	var se *StatusError
	if _, err := whs[0].Review(context.Background(), req); !errors.As(err, &se) || se.Policy != "busy" || se.Code != 503 {
		t.Errorf("unanswered in a run: %v", err)
	}

	boom := member("A", "boom")
	boom.Mutator = groupMember{key: "A", name: "boom", panics: true, runs: &runs}
	whs, _ = NewWebhooks([]Hook{member("A", "a1"), boom})
	var pe *PanicError
	if _, err := whs[0].Review(context.Background(), req); !errors.As(err, &pe) || pe.Policy != "boom" {
		t.Errorf("panic in a run: %v", err)
	}
}
