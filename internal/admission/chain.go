package admission

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	apiserveradmission "k8s.io/apiserver/pkg/admission"

	"github.com/kadmit/kadmit/internal/jsonedit"
)

// PanicError is returned by Webhook.Review when a policy panicked. The server
// answers it with HTTP 500 so the webhook's failurePolicy applies, instead of a
// made-up admission decision.
type PanicError struct {
	Policy string
	Value  any
	Stack  []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("policy %s panicked: %v", e.Policy, e.Value)
}

// Webhook is the set of hooks served on one path, run in order. All hooks of a
// webhook have the same Type.
type Webhook struct {
	Path  string
	Type  Type
	Hooks []Hook

	// matched caches which hooks match requests with given rule
	// attributes (see hookMatches); a Webhook must not be copied.
	matched atomic.Pointer[matchCache]
}

// Outcome is what a webhook decided about one request.
type Outcome struct {
	// Response is the AdmissionResponse to send, uid already set.
	Response *admissionv1.AdmissionResponse
	// Patch is the JSONPatch sent in Response: the operations of every
	// mutator that ran, in order, each against the object as the previous
	// ones left it. Nil when nothing changed, on denial, or when the
	// webhook is validating.
	Patch []jsonedit.Op
	// Object is the object after every mutator ran: the request's own
	// object when nothing changed. The HTTP handler, which never reads it,
	// leaves it nil when there is a patch.
	Object []byte
	// Policy names the hook that denied, or "" when allowed.
	Policy string
	// Matched is how many hooks matched the request.
	Matched int
}

// NewWebhooks groups hooks by path, keeping their order. It returns an error
// when a path mixes mutating and validating hooks, a hook's Type disagrees with
// its Validator/Mutator, or a path is empty.
func NewWebhooks(hooks []Hook) ([]*Webhook, error) {
	byPath := map[string]*Webhook{}
	var out []*Webhook
	for _, h := range hooks {
		if h.Path == "" || h.Path[0] != '/' {
			return nil, fmt.Errorf("policy %s: path %q must start with /", h.Policy, h.Path)
		}
		switch {
		case h.Type == Mutating && h.Mutator == nil, h.Type == Validating && h.Validator == nil,
			h.Type != Mutating && h.Type != Validating:
			return nil, fmt.Errorf("policy %s: hook on %s has type %q without a matching implementation", h.Policy, h.Path, h.Type)
		}
		wh := byPath[h.Path]
		if wh == nil {
			wh = &Webhook{Path: h.Path, Type: h.Type}
			byPath[h.Path] = wh
			out = append(out, wh)
		}
		if wh.Type != h.Type {
			return nil, fmt.Errorf("path %s mixes %s and %s hooks", h.Path, wh.Type, h.Type)
		}
		wh.Hooks = append(wh.Hooks, h)
	}
	return out, nil
}

// Review runs the webhook's hooks that match req, in order, and builds the
// response. Each mutator sees the object as the previous ones left it: the
// operations a mutator returns are applied (jsonedit.Apply) only when
// another mutator follows, and the response patch is their concatenation;
// the chain never diffs an object. The first denial ends the chain; warnings and
// audit annotations accumulate. A run of matched hooks whose Mutators are
// GroupMutators of one group, with no other matched hook between them, is
// served by one MutateGroup call (one decode and one encode of the object
// for the declared MutatingAdmissionPolicies): each member's verdict is
// still folded under its own hook's name, in order, and its operations
// are the run's. A panicking policy yields a *PanicError and no outcome; a
// patch that does not apply to the object it was made for, an error.
func (w *Webhook) Review(ctx context.Context, req *Request) (out Outcome, err error) {
	return w.review(ctx, req, reviewForObject)
}

// reviewMode is what a review's caller reads of it, and so what the review
// may reuse once it ends.
type reviewMode uint8

const (
	// reviewForObject: Review, whose Outcome holds the final object.
	reviewForObject reviewMode = iota
	// reviewForAnswer: the HTTP handler, which reads only the Response.
	// The buffers of the objects the chain makes are reused.
	reviewForAnswer
	// reviewForAnswerBounded: reviewForAnswer on a path whose hooks are
	// all Bounded (built-in policies), whose requests no hook keeps or
	// looks up by address (as celpolicy's request cache does): the
	// requests the chain makes are reused too.
	reviewForAnswerBounded
)

// review is Review for mode reviewForObject; for the HTTP handler's modes
// (which read only the Response) the last mutator's operations are not applied,
// Outcome.Object is nil when there is a patch, Outcome.Patch is nil (its
// operations may read the objects the chain made, whose buffers go back
// to chainSlots when the review ends), and the objects an earlier
// mutator's operations were applied to are made in reused buffers (with
// reviewForAnswerBounded, in reused requests too).
func (w *Webhook) review(ctx context.Context, req *Request, mode reviewMode) (Outcome, error) {
	withObject := mode == reviewForObject
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	out := Outcome{Response: resp}
	matched := w.matcher(req)
	cur := req                // the request as the next hook sees it
	var pending []jsonedit.Op // the last mutator's operations, not yet in cur
	// Who made pending, for apply's error: one hook, or a group's run
	// (named only if its patch fails, not on every request).
	var pendingPolicy string
	var pendingRun []*Hook
	// The objects (and, with reviewForAnswerBounded, the requests) the
	// chain made, when it owns them (not withObject: then nothing reads
	// them once the review ends).
	var held [maxHeldObjects]*chainSlot
	nheld := 0
	release := func() {
		for _, sl := range held[:nheld] {
			sl.ch = chained{} // holds nothing of this review
			chainSlots.Put(sl)
		}
		nheld = 0
	}
	apply := func() error {
		// The next mutator reads the result: ApplyIndexed starts from the
		// located top level of the object it edits and, for edits below the
		// top level (every policy's so far), locates the result's by shifting
		// offsets, so neither the splice nor the next Doc scans the object
		// from the start.
		//
		// The request the next hook sees and the Index of its object are
		// one allocation.
		var sl *chainSlot
		var dst []byte
		var next *chained
		if !withObject && nheld < len(held) {
			sl = chainSlots.Get().(*chainSlot)
			dst = sl.buf
			if mode == reviewForAnswerBounded {
				next = &sl.ch
			}
		}
		if next == nil {
			next = new(chained)
		}
		next.req = *cur
		obj, err := jsonedit.ApplyIndexedTo(dst, cur.Object.Raw, cur.objectIndex, pending, &next.ix)
		if sl != nil {
			// obj is dst's array or a new one (then kept for the next
			// review instead of dst's), unless it is the object itself.
			if err == nil && cap(obj) > 0 && cap(obj) <= maxPooledObject && !sameArray(obj, cur.Object.Raw) {
				sl.buf = obj[:0]
				held[nheld] = sl
				nheld++
			} else {
				sl.ch = chained{}
				chainSlots.Put(sl)
			}
		}
		if err != nil {
			if pendingRun != nil {
				pendingPolicy = strings.Join(policyNames(pendingRun), ", ")
			}
			return fmt.Errorf("policy %s: its JSONPatch does not apply to the object it was given: %w", pendingPolicy, err)
		}
		next.req.Object = runtime.RawExtension{Raw: obj}
		next.req.objectIndex = nil // it located the members of the previous bytes
		if _, ok := next.ix.Len(obj); ok {
			next.req.objectIndex = &next.ix
		}
		cur, pending = &next.req, nil
		return nil
	}
	// addOps adds a hook's operations to the response patch, as one more
	// run: they are encoded run after run (jsonedit.AppendPatch), not
	// copied into one slice first. A chain has two or three mutators;
	// more runs than the array holds move to the heap.
	var runsArr [4][]jsonedit.Op
	runs := runsArr[:0]
	addOps := func(ops []jsonedit.Op) { runs = append(runs, ops) }
	for i := 0; i < len(w.Hooks); i++ {
		h := &w.Hooks[i]
		if !matched.match(w, i) {
			continue
		}
		out.Matched++
		if len(pending) > 0 {
			if err := apply(); err != nil {
				return Outcome{}, err
			}
		}
		if g, ok := h.Mutator.(GroupMutator); ok && w.Type == Mutating {
			// A run of one group's hooks: the matched hooks from i on
			// whose Mutators are of g's group, up to the first matched
			// hook that is not (it must see their result). They are
			// decided one by one, as if chained: each verdict is folded
			// under its own hook's name, the first denial ends the
			// chain; their operations are the group's, made once.
			run, hooks := []Mutator{g}, []*Hook{h}
			key := g.MutatorGroup()
			for j := i + 1; j < len(w.Hooks); j++ {
				if !matched.match(w, j) {
					continue
				}
				gj, ok := w.Hooks[j].Mutator.(GroupMutator)
				if !ok || gj.MutatorGroup() != key {
					break
				}
				run, hooks = append(run, gj), append(hooks, &w.Hooks[j])
				out.Matched++
				i = j
			}
			var ops []jsonedit.Op
			var unanswered error
			ended, running := false, h.Policy
			if err := callPolicy(h.Policy, func() {
				ops = g.MutateGroup(ctx, cur, run, func(k int) { running = hooks[k].Policy }, func(k int, v Verdict) bool {
					p := hooks[k].Policy
					if se := v.unanswered; se != nil {
						unanswered, ended = &StatusError{Policy: p, Code: se.Code, Err: se.Err}, true
						return false
					}
					if !addVerdict(resp, p, v) {
						out.Policy, ended = p, true
						return false
					}
					return true
				})
			}); err != nil {
				if pe, ok := err.(*PanicError); ok {
					pe.Policy = running
				}
				return Outcome{}, err
			}
			if unanswered != nil {
				return Outcome{}, unanswered
			}
			if ended {
				break
			}
			if len(ops) > 0 {
				addOps(ops)
				pending, pendingRun = ops, hooks
			}
			continue
		}
		var v Verdict
		var ops []jsonedit.Op
		if err := callPolicy(h.Policy, func() {
			if w.Type == Mutating {
				ops, v = h.Mutator.Mutate(ctx, cur)
			} else {
				v = h.Validator.Validate(ctx, cur)
			}
		}); err != nil {
			return Outcome{}, err
		}
		if se := v.unanswered; se != nil {
			return Outcome{}, &StatusError{Policy: h.Policy, Code: se.Code, Err: se.Err}
		}
		if !addVerdict(resp, h.Policy, v) {
			out.Policy = h.Policy
			break
		}
		if len(ops) > 0 {
			addOps(ops)
			pending, pendingPolicy, pendingRun = ops, h.Policy, nil
		}
	}
	resp.Warnings = sanitizeWarnings(resp.Warnings)
	if !resp.Allowed || len(runs) == 0 {
		release()
		out.Patch, out.Object = nil, req.Object.Raw
		return out, nil
	}
	patch, err := jsonedit.AppendPatch(nil, runs...)
	if err != nil {
		return Outcome{}, fmt.Errorf("encode JSONPatch for %s: %w", w.Path, err)
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &pt
	if !withObject {
		// The patch is encoded: nothing reads the chain's objects now.
		release()
	} else {
		// The first run is used as it is (clipped, so that nothing is
		// ever written into the hook's slice); more are copied with it
		// into one slice of the size they need.
		out.Patch = slices.Clip(runs[0])
		if len(runs) > 1 {
			out.Patch = slices.Concat(runs...)
		}
		if len(pending) > 0 {
			if err := apply(); err != nil {
				return Outcome{}, err
			}
		}
		out.Object = cur.Object.Raw
	}
	return out, nil
}

// chainSlots holds what a mutating chain makes for the HTTP handler's
// reviews, for the next review to reuse (*chainSlot): an object is a few
// KiB, and a request with its Index two more, made once per request a
// second mutator reads; a reused one is still in the CPU's cache where a
// new one is not. A review takes at most maxHeldObjects and gives them back
// when its patch is encoded; an object above maxPooledObject is left to
// the garbage collector, so the pool holds at most that much per slot (and
// sync.Pool drops what two collections find unused).
var chainSlots = sync.Pool{New: func() any { return new(chainSlot) }}

// chainSlot is a pooled object buffer (empty) and, for
// reviewForAnswerBounded, the request built over it.
type chainSlot struct {
	buf []byte
	ch  chained
}

const (
	maxHeldObjects  = 4
	maxPooledObject = 64 << 10
)

// sameArray reports whether a and b (neither empty) start at the same
// byte.
func sameArray(a, b []byte) bool {
	return len(b) > 0 && &a[:1][0] == &b[0]
}

// chained is the request a hook in a mutating chain sees after an earlier
// hook's operations were applied, with the Index of its object.
type chained struct {
	req Request
	ix  jsonedit.Index
}

// addVerdict folds policy's verdict into resp, the one place a verdict
// becomes response: its warnings, its audit annotations (a key the API
// server would refuse is dropped, with a warning) and, when it denies,
// Allowed false and the Status, with code 403 and the message "denied by
// kadmit policy <policy>" when the verdict leaves them empty. It reports
// whether the verdict allowed.
func addVerdict(resp *admissionv1.AdmissionResponse, policy string, v Verdict) bool {
	resp.Warnings = append(resp.Warnings, v.Warnings...)
	for k, val := range v.AuditAnnotations {
		if !validAuditKey(k) {
			resp.Warnings = append(resp.Warnings, fmt.Sprintf("kadmit: policy %s: dropped invalid audit annotation key %q", policy, k))
			continue
		}
		if resp.AuditAnnotations == nil {
			resp.AuditAnnotations = map[string]string{}
		}
		resp.AuditAnnotations[k] = val
	}
	if v.Allowed {
		return true
	}
	resp.Allowed = false
	resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: v.Code, Reason: v.Reason, Message: v.Message}
	if resp.Result.Code == 0 {
		resp.Result.Code = 403
	}
	if resp.Result.Message == "" {
		resp.Result.Message = fmt.Sprintf("denied by kadmit policy %s", policy)
	}
	return false
}

func policyNames(hooks []*Hook) []string {
	names := make([]string, len(hooks))
	for i, h := range hooks {
		names[i] = h.Policy
	}
	return names
}

func callPolicy(policy string, f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Policy: policy, Value: r, Stack: debug.Stack()}
		}
	}()
	f()
	return nil
}

// Rule matching reads five attributes of a request: resource (group,
// version, name), subresource, operation, and whether it has a namespace.
// The API server sends a webhook a handful of distinct combinations, so
// each Webhook remembers, per combination, which of its hooks MatchRules
// selects: a request with a known combination costs a map lookup instead of
// building apiserver admission.Attributes and splitting every rule's
// resources. The cache holds at most maxMatchCache combinations (more are
// matched without caching, so hostile attribute values cannot grow it) and
// is copied on write, so lookups take no lock.
const maxMatchCache = 64

// maxMatchKeyBytes bounds the attribute bytes one cached combination keeps:
// the API server sends names of at most a few hundred bytes, a client that
// sends megabytes of resource name is matched without caching, so 64
// entries never pin more than 64 × 1 KiB.
const maxMatchKeyBytes = 1 << 10

type ruleKey struct {
	group, version, resource, subresource, operation string
	namespaced                                       bool
}

func (k ruleKey) size() int {
	return len(k.group) + len(k.version) + len(k.resource) + len(k.subresource) + len(k.operation)
}

// clone copies the strings, so a cached key never keeps a request's buffer
// alive.
func (k ruleKey) clone() ruleKey {
	return ruleKey{strings.Clone(k.group), strings.Clone(k.version), strings.Clone(k.resource),
		strings.Clone(k.subresource), strings.Clone(k.operation), k.namespaced}
}

type matchCache struct {
	hooks *Hook // &Hooks[0] when built: a changed Hooks slice starts over
	n     int
	m     map[ruleKey]uint64 // bit i: Hooks[i] matches
}

var matchCacheMu sync.Mutex // serializes cache writers of every Webhook; writes are rare

// hookMatcher tells which hooks of a Webhook match one request.
type hookMatcher struct {
	bits  uint64                        // bit i: Hooks[i] matches (at most 64 hooks)
	attrs apiserveradmission.Attributes // set instead for a webhook with more hooks
}

func (m hookMatcher) match(w *Webhook, i int) bool {
	if m.attrs != nil {
		return MatchRules(w.Hooks[i].Rules, m.attrs)
	}
	return m.bits&(1<<i) != 0
}

// matcher returns which of Hooks match req, as MatchRules with
// RuleAttributes(req) decides it.
func (w *Webhook) matcher(req *Request) hookMatcher {
	if len(w.Hooks) == 0 || len(w.Hooks) > 64 {
		return hookMatcher{attrs: RuleAttributes(req)}
	}
	r := req.Resource
	k := ruleKey{r.Group, r.Version, r.Resource, req.SubResource, string(req.Operation), req.Namespace != ""}
	c := w.matched.Load()
	if c != nil && c.hooks == &w.Hooks[0] && c.n == len(w.Hooks) {
		if bits, ok := c.m[k]; ok {
			return hookMatcher{bits: bits}
		}
	}
	attrs := RuleAttributes(req)
	var bits uint64
	for i := range w.Hooks {
		if MatchRules(w.Hooks[i].Rules, attrs) {
			bits |= 1 << i
		}
	}
	matchCacheMu.Lock()
	defer matchCacheMu.Unlock()
	c = w.matched.Load()
	if c == nil || c.hooks != &w.Hooks[0] || c.n != len(w.Hooks) {
		c = &matchCache{hooks: &w.Hooks[0], n: len(w.Hooks)}
	}
	if len(c.m) < maxMatchCache && k.size() <= maxMatchKeyBytes {
		next := &matchCache{hooks: c.hooks, n: c.n, m: make(map[ruleKey]uint64, len(c.m)+1)}
		for kk, v := range c.m {
			next.m[kk] = v
		}
		next.m[k.clone()] = bits
		w.matched.Store(next)
	}
	return hookMatcher{bits: bits}
}
