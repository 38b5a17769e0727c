package celpolicy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kadmit/kadmit/internal/admission"
)

// Declared policies read the request's object decoded into unstructured
// maps, which take far more memory than its JSON: measured with
// unstructured.UnmarshalJSON (apimachinery v0.37.1, go1.26) on 1 MiB
// objects, the decoded value holds 3.5x (nulls) to 44x ({"a":1} objects)
// the JSON and allocates 12x to 53x while decoding; a realistic pod holds
// about 8x. The 32 MiB body budget (admission.Limits) counts bytes
// received, so it cannot bound this: Budget does, for every decode of a
// request's object and oldObject the declared policies make.

// Defaults of Options.MaxObjectBytes and Options.Budget.
const (
	// DefaultMaxObjectBytes is the largest object or oldObject JSON the
	// declared policies are evaluated on when served: 1.5 MiB, etcd's
	// default --max-request-bytes, so no object the API server can store
	// is refused (only a dry-run request, which never reaches etcd, can
	// carry a larger one). A larger object gets HTTP 413: the policy's
	// failurePolicy decides.
	DefaultMaxObjectBytes = 3 << 19
	// DefaultDecodeBudgetBytes bounds the estimated memory (see estimate)
	// of the objects the declared policies hold decoded at once, across
	// every request of the process: 64 MiB. kadmit serving declared
	// policies idles at about 90 MiB RSS (the CEL environments and the
	// built-in kinds' apply schemas); with the 32 MiB body budget this
	// keeps the worst case under the chart's GOMEMLIMIT=200MiB
	// (docs/security.md "Bounds").
	DefaultDecodeBudgetBytes int64 = 64 << 20
	// mutateFactor is what a run of mutating policies on one request
	// takes, once for the run (mutateRun), in estimates of its object:
	// the decoded object, the typed value and field sets
	// structured-merge-diff builds for an ApplyConfiguration (measured: a
	// 1.5 MB pod of 48,000 environment variables through one trivial
	// ApplyConfiguration MAP took RSS from 85 to 231 MiB, about 4 times
	// the estimate), the patched copy and the dispatcher's copy of its
	// last output, and the two decodes of the diff. The policies of a run
	// take turns on the one decoded object: what each builds beside it is
	// garbage once the next starts.
	mutateFactor = 4
)

// ErrObjectTooLarge is wrapped by the errors of requests whose object is
// beyond what the declared policies evaluate: larger than MaxObjectBytes,
// or estimated to decode to more than the whole Budget. They are answered
// HTTP 413; retrying cannot help.
var ErrObjectTooLarge = errors.New("object too large for kadmit's declared policies")

// ErrDecodeBudget is wrapped by the errors of requests refused because the
// decoded-bytes Budget is spent by other requests; it wraps admission.ErrBusy
// and is answered HTTP 503, so the webhook's failurePolicy decides and a
// retry may succeed.
var ErrDecodeBudget = fmt.Errorf("%w of objects decoded for declared policies at once", admission.ErrBusy)

// Budget bounds the memory of the objects declared policies hold decoded
// at once, shared by every request (and every Engine: a reloaded policy
// set keeps its process's Budget). Each decode takes its estimate (see
// estimate) before it starts and gives it back when the hook that needed
// it returns, or, for the objects the validating hooks of one request
// share, when the request's context ends (its answer is sent, or it was
// abandoned at its deadline). Safe for concurrent use.
type Budget struct {
	max     int64
	used    atomic.Int64
	refused atomic.Int64
}

// NewBudget returns a Budget of max bytes (<= 0: DefaultDecodeBudgetBytes).
func NewBudget(max int64) *Budget {
	if max <= 0 {
		max = DefaultDecodeBudgetBytes
	}
	return &Budget{max: max}
}

// Max is the budget's size in bytes.
func (b *Budget) Max() int64 { return b.max }

// Used is the estimated decoded bytes held now.
func (b *Budget) Used() int64 { return b.used.Load() }

// Refused counts the decodes refused because the budget was spent.
func (b *Budget) Refused() int64 { return b.refused.Load() }

func (b *Budget) take(n int64) error {
	if n > b.max {
		return fmt.Errorf("%w: it would take an estimated %d bytes decoded, more than the whole %d-byte budget for decoded objects", ErrObjectTooLarge, n, b.max)
	}
	for {
		cur := b.used.Load()
		if cur+n > b.max {
			b.refused.Add(1)
			return fmt.Errorf("%w: %d bytes (%d held, this object needs an estimated %d)", ErrDecodeBudget, b.max, cur, n)
		}
		if b.used.CompareAndSwap(cur, cur+n) {
			return nil
		}
	}
}

func (b *Budget) give(n int64) { b.used.Add(-n) }

// meter is what one holder (a hook call, or a request's shared decoded
// objects) took from a Budget; a nil meter, or one without a Budget
// (offline: `kadmit review`, `kadmit test`), takes nothing.
type meter struct {
	b    *Budget
	mu   sync.Mutex // guards the fields below and serializes charges
	held atomic.Int64
	// users counts the hooks running on a shared meter; ended is set when
	// its request's context ends. A shared meter gives its bytes back
	// once both hold: an abandoned review's hook still decoding keeps
	// them until it returns, and charges nothing more after that.
	users int
	ended bool
}

func newMeter(b *Budget) *meter {
	if b == nil {
		return nil
	}
	return &meter{b: b}
}

// charge takes n bytes for m.
func (m *meter) charge(n int64) error {
	if m == nil || m.b == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ended {
		return errReviewEnded
	}
	if err := m.b.take(n); err != nil {
		return err
	}
	m.held.Add(n)
	return nil
}

// errReviewEnded refuses a charge to the meter of a request whose context
// ended (its review was answered or abandoned): nothing would give it back.
var errReviewEnded = errors.New("the review already ended")

// enter and leave bracket a hook running on a shared meter; end is called
// when its request's context ends. The last of leave and end releases.
func (m *meter) enter() {
	if m != nil {
		m.mu.Lock()
		m.users++
		m.mu.Unlock()
	}
}

func (m *meter) leave() {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.users--
	done := m.ended && m.users == 0
	m.mu.Unlock()
	if done {
		m.release()
	}
}

func (m *meter) end() {
	m.mu.Lock()
	m.ended = true
	done := m.users == 0
	m.mu.Unlock()
	if done {
		m.release()
	}
}

// chargeJSON takes the estimate of decoding raw.
func (m *meter) chargeJSON(raw []byte) error {
	if m == nil || m.b == nil || raw == nil {
		return nil
	}
	return m.charge(estimate(raw))
}

// ensure makes m hold at least n bytes, taking only what it lacks: the
// hooks of one request that share a meter (requestMeters) hold the largest
// need of any of them, not the sum.
func (m *meter) ensure(n int64) error {
	if m == nil || m.b == nil {
		return nil
	}
	if n > m.b.max {
		return m.b.take(n) // refused as too large, taking nothing
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ended {
		return errReviewEnded
	}
	if h := m.held.Load(); n > h {
		if err := m.b.take(n - h); err != nil {
			return err
		}
		m.held.Add(n - h)
	}
	return nil
}

// release gives back everything m took.
func (m *meter) release() {
	if m != nil && m.b != nil {
		m.b.give(m.held.Swap(0))
	}
}

// The per-token costs of estimate, in bytes: an upper bound of what the
// decoded value holds, fitted on the measurements above (1 MiB of each
// shape; estimate / held): {"a":1} objects 392/353 bytes each, ints
// 82/17, strings "a" 84/34, {} 323/64, [] 211/40, "kN":"v" members 155/75,
// a realistic pod 1.4x of its decoded size. The allocation while decoding
// is up to twice the value held; that garbage is reclaimed as the heap
// nears GOMEMLIMIT, the value itself only when the hook returns.
const (
	costValue  = 80  // each value: its interface, its boxed scalar or header
	costMember = 64  // each object member: its key and map slot
	costObject = 160 // each object: its map and first group
	costArray  = 48  // each array: its slice header and growth
)

// estimate returns an upper bound of the bytes raw's JSON value holds once
// decoded into unstructured maps: its length plus a cost per value,
// member, object and array, counted by one pass over raw without
// allocating. It does not validate raw; the decoder does.
func estimate(raw []byte) int64 {
	var commas, colons, objects, arrays int64
	inString, escaped := false, false
	for _, c := range raw {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case ',':
			commas++
		case ':':
			colons++
		case '{':
			objects++
		case '[':
			arrays++
		}
	}
	// Every value but the first of a container follows a comma; each
	// container starts one more.
	values := commas + objects + arrays + 1
	return int64(len(raw)) + costValue*values + costMember*colons + costObject*objects + costArray*arrays
}

// requestMeters gives the mutating hooks of one request one meter, held
// from the first run of them until the request's context ends: the
// policies the request reaches one after another run on one decoded copy
// (serveMutateGroup), but a hook of another kind between them splits
// them into runs, each needing about as much as the last, and a request
// that got its share keeps it through the chain instead of competing for
// it again at each run (and being refused 503 halfway). Entries live as long as their
// requests, so there are at most as many as requests in flight.
type requestMeters struct {
	mu sync.Mutex
	m  map[context.Context]*meter
}

// get returns ctx's meter, entered (see enter), and whether the caller
// must release it itself (a context that never ends: offline use) rather
// than leave it.
func (r *requestMeters) get(ctx context.Context, b *Budget) (*meter, bool) {
	if b == nil {
		return nil, false
	}
	if ctx.Done() == nil {
		return newMeter(b), true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.m[ctx]
	if m == nil {
		if r.m == nil {
			r.m = map[context.Context]*meter{}
		}
		m = newMeter(b)
		r.m[ctx] = m
		context.AfterFunc(ctx, func() {
			r.mu.Lock()
			delete(r.m, ctx)
			r.mu.Unlock()
			m.end()
		})
	}
	m.enter()
	return m, false
}
