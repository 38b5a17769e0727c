package admission

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kadmit/kadmit/internal/logging"
)

// DefaultMaxRequestBytes bounds an AdmissionReview body: 7 MiB. The API server
// accepts request bodies up to 3 MiB and sends the object and, on UPDATE, the
// old object, each possibly that large, plus the review envelope.
const DefaultMaxRequestBytes int64 = 7 << 20

// DefaultTimeout bounds a review when the API server sends no ?timeout=.
const DefaultTimeout = 10 * time.Second

// Decision describes one answered HTTP request for logging and metrics.
type Decision struct {
	Webhook   string // path, e.g. "/validate-pod"
	UID       string
	Kind      string // request.kind.kind, e.g. "Pod"
	Namespace string
	Name      string
	Operation string
	// HTTPCode is the HTTP status written: 200 for every decision, 4xx for
	// bad input, 500 for a panic or failure (the failurePolicy applies).
	HTTPCode int
	// Allowed and ResultCode describe the admission decision when HTTPCode is 200.
	Allowed    bool
	ResultCode int32
	Message    string
	Policy     string // the denying policy
	Patched    bool
	Latency    time.Duration
	Panic      *PanicError // set when a policy panicked
	Err        error       // why the request was not answered with a decision
}

// HandlerOptions configure NewHandler.
type HandlerOptions struct {
	// MaxRequestBytes bounds the body; 0 means DefaultMaxRequestBytes.
	MaxRequestBytes int64
	// Limits, shared by every handler of a server, bound requests in flight
	// and body bytes buffered at once, and abandoned reviews (see call.run);
	// nil means a private NewLimits(0, 0).
	Limits *Limits
	// Observe, when set, is called once per request after the answer is
	// written, with the request's context (a tracing span, if any, is in
	// it).
	Observe func(ctx context.Context, d Decision)
	// Logger is the base of each review's request-scoped logger: the
	// context a policy receives carries it with the webhook path and the
	// request's uid (logging.FromContext). nil: slog.Default().
	Logger *slog.Logger
	// AbandonedRan, when set, is called when an abandoned review's policy
	// returns, with how long it ran after the review's answer was sent
	// (wall time: Go has no per-goroutine CPU clock).
	AbandonedRan func(webhook string, d time.Duration)
}

// NewHandler serves wh over HTTP: it checks Content-Type (415 otherwise), bounds
// the body (413), decodes AdmissionReview v1 or v1beta1 (400 with a one-line
// reason), bounds the review by the API server's ?timeout= (at most
// MaxTimeout, counted from the moment the request's headers were read) and
// answers with the request's apiVersion. A panicking policy, a review that
// misses its deadline or an encoding failure is answered with HTTP 500, and a
// request refused because Limits are reached with HTTP 503, so the webhook's
// failurePolicy decides, never with an invented admission decision.
//
// Memory is sized from bytes received, never from the declared
// Content-Length: a body grows in steps, each step reserved from Limits
// first, so a client that declares 7 MiB and sends one byte holds one small
// buffer.
//
// The context a policy receives carries the review's logger (opts.Logger
// with "webhook" and "uid"; logging.FromContext). It is pooled with the
// review and reused once the policy returns: a policy must not keep it, or
// a context derived from it, past its return.
func NewHandler(wh *Webhook, opts HandlerOptions) http.Handler {
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if opts.Limits == nil {
		opts.Limits = NewLimits(0, 0)
	}
	return &handler{wh: wh, opts: opts, inline: allBounded(wh)}
}

type handler struct {
	wh   *Webhook
	opts HandlerOptions
	// inline: every hook is Bounded, so reviews run on the request's own
	// goroutine (call.run).
	inline bool
}

// allBounded reports whether every hook of wh is Bounded.
func allBounded(wh *Webhook) bool {
	for i := range wh.Hooks {
		h := &wh.Hooks[i]
		var p any = h.Validator
		if h.Mutator != nil {
			p = h.Mutator
		}
		if _, ok := p.(Bounded); !ok {
			return false
		}
	}
	return true
}

// lease is one request's share of Limits: its in-flight slot and the body
// bytes it reserved. It is returned once: by the handler; or, when the
// review was abandoned at its deadline, at the answer if Limits admit it
// among the abandoned reviews that release theirs (takeReleased), else by
// the review goroutine when the policy finally returns (see call.run).
type lease struct {
	lim      *Limits
	reserved int64
}

func (l *lease) reserve(n int64) error {
	if err := l.lim.reserve(n); err != nil {
		return err
	}
	l.reserved += n
	return nil
}

func (l *lease) release() {
	l.lim.unreserve(l.reserved)
	l.reserved = 0
	l.lim.release()
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	d := Decision{Webhook: h.wh.Path}
	defer func() {
		d.Latency = time.Since(start)
		if h.opts.Observe != nil {
			h.opts.Observe(r.Context(), d)
		}
	}()
	bodyRead := false
	fail := func(code int, err error) {
		d.HTTPCode, d.Err = code, err
		// HTTP/1.1 only (HTTP/2 resets the stream by itself): answering
		// before the body is read, net/http would wait for the rest of it
		// (to reuse the connection) before writing the answer, and a
		// stalled client never sends it. Close instead, after the answer.
		closeConn := !bodyRead && r.ProtoMajor == 1
		if closeConn {
			w.Header().Set("Connection", "close")
		}
		http.Error(w, err.Error(), code)
		if closeConn {
			rc := http.NewResponseController(w)
			_ = rc.Flush()
			_ = rc.SetReadDeadline(time.Now())
		}
	}

	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		fail(http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed: AdmissionReview is sent with POST", r.Method))
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" { // the API server's spelling, checked without parsing
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			fail(http.StatusUnsupportedMediaType, fmt.Errorf("Content-Type %q is not application/json", ct))
			return
		}
	}
	// A declared length may refuse a request early; it never sizes anything.
	if r.ContentLength > h.opts.MaxRequestBytes {
		fail(http.StatusRequestEntityTooLarge, fmt.Errorf("AdmissionReview body of %d bytes exceeds %d bytes", r.ContentLength, h.opts.MaxRequestBytes))
		return
	}
	if err := h.opts.Limits.acquire(); err != nil {
		fail(http.StatusServiceUnavailable, err)
		return
	}
	c := callPool.Get().(*call)
	c.h, c.ls = h, lease{lim: h.opts.Limits}
	ls := &c.ls
	owned := true // false once an abandoned review goroutine owns the call and its lease
	defer func() {
		if owned {
			ls.release()
			c.recycle()
		}
	}()

	timeout := DefaultTimeout
	if t := queryTimeout(r); t != "" {
		if pt, err := time.ParseDuration(t); err == nil && pt > 0 {
			timeout = min(pt, MaxTimeout)
		}
	}
	// The API server's clock started when it sent the request, so the
	// deadline counts from the headers, not from the end of the body. Answer
	// a little before the API server gives up, so a slow policy shows up as
	// our 500 (logged, counted) rather than as a bare client timeout.
	ctx, cancel := context.WithDeadline(r.Context(), start.Add(timeout-timeout/10))
	defer cancel()

	buf, err := readBody(http.MaxBytesReader(w, r.Body, h.opts.MaxRequestBytes), ls, h.opts.MaxRequestBytes)
	if err != nil {
		putBody(buf)
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			fail(http.StatusRequestEntityTooLarge, fmt.Errorf("AdmissionReview body exceeds %d bytes", h.opts.MaxRequestBytes))
		case errors.Is(err, ErrBusy):
			fail(http.StatusServiceUnavailable, err)
		case errors.Is(err, os.ErrDeadlineExceeded):
			fail(http.StatusRequestTimeout, fmt.Errorf("read AdmissionReview body: %w", err))
		default:
			fail(http.StatusBadRequest, fmt.Errorf("read AdmissionReview body: %w", err))
		}
		return
	}
	bodyRead = true
	review, req, err := decodeRequest(*buf)
	// DecodeReview copies what it keeps; the lease's reservation now stands
	// for that copy until the review ends.
	putBody(buf)
	if err != nil {
		fail(http.StatusBadRequest, err)
		return
	}
	d.UID, d.Kind, d.Namespace, d.Name, d.Operation = string(req.UID), req.Kind.Kind, req.Namespace, req.Name, string(req.Operation)

	// The review's context carries its logger: built only if a policy
	// logs (logging.FromContext), the RequestContext itself lives in the
	// pooled call, so an unlogged review allocates nothing for it.
	c.rctx.Reset(ctx, h.opts.Logger, h.wh.Path, string(req.UID))
	out, abandoned, err := c.run(&c.rctx, req)
	owned = !abandoned
	if err != nil {
		var pe *PanicError
		if errors.As(err, &pe) {
			d.Panic = pe
		}
		code := http.StatusInternalServerError
		if se := (*StatusError)(nil); errors.As(err, &se) {
			code = se.Code
		}
		fail(code, fmt.Errorf("review %s: %w", req.UID, err))
		return
	}
	d.Allowed, d.Patched, d.Policy = out.Response.Allowed, out.Response.Patch != nil, out.Policy
	if res := out.Response.Result; res != nil {
		d.ResultCode, d.Message = res.Code, res.Message
	}
	rb := respPool.Get().(*[]byte)
	payload, err := appendEncodedResponse(*rb, review.APIVersion, out.Response)
	if err != nil {
		putResp(rb)
		fail(http.StatusInternalServerError, err)
		return
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	// Declared: net/http sends an answer larger than its 2,048-byte
	// chunking buffer (a mutating answer for the realistic pod is 2.6 KB)
	// chunked otherwise, and the API server reads a length more simply.
	hdr.Set("Content-Length", strconv.Itoa(len(payload)))
	d.HTTPCode = http.StatusOK
	_, _ = w.Write(payload) // copies: a ResponseWriter keeps nothing of p
	*rb = payload
	putResp(rb)
}

// Answer buffers are pooled like bodies: a mutating answer is the patch in
// base64 plus the envelope, 2-3 KB for the realistic pod, and it is dead
// once written.
const maxPooledResp = 64 << 10

var respPool = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

func putResp(b *[]byte) {
	if cap(*b) <= maxPooledResp {
		*b = (*b)[:0]
		respPool.Put(b)
	}
}

// Body buffers come from a pool: DecodeReview copies what it keeps, so a
// buffer is free again once the request is decoded, and reusing it saves the
// several growing allocations io.ReadAll makes for each 5 KB body.
const (
	// minBody is a pooled buffer's starting capacity.
	minBody = 16 << 10
	// maxPooledBody keeps buffers grown by rare huge objects (up to 7 MiB)
	// from staying in the pool.
	maxPooledBody = 256 << 10
)

var bodyPool = sync.Pool{New: func() any { b := make([]byte, 0, minBody); return &b }}

func putBody(b *[]byte) {
	if b != nil && cap(*b) <= maxPooledBody {
		*b = (*b)[:0]
		bodyPool.Put(b)
	}
}

// readBody reads r into a pooled buffer that grows (doubling, capped at
// max+1 so MaxBytesReader can report an oversized body) only as bytes
// arrive, reserving each growth from ls first. It returns the buffer even
// on error, for putBody.
func readBody(r io.Reader, ls *lease, max int64) (*[]byte, error) {
	if err := ls.reserve(minBody); err != nil {
		return nil, err
	}
	bp := bodyPool.Get().(*[]byte)
	b := (*bp)[:0]
	// A pooled buffer may be larger than minBody; account for all of it.
	if extra := int64(cap(b)) - minBody; extra > 0 {
		if err := ls.reserve(extra); err != nil {
			putBody(bp)
			return nil, err
		}
	}
	for {
		if len(b) == cap(b) {
			newCap := min(2*int64(cap(b)), max+1)
			if newCap <= int64(cap(b)) {
				newCap = int64(cap(b)) + bytes.MinRead
			}
			if err := ls.reserve(newCap - int64(cap(b))); err != nil {
				*bp = b
				return bp, err
			}
			nb := make([]byte, len(b), newCap)
			copy(nb, b)
			putBody(bp)
			bp = &nb
			b = nb
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			*bp = b
			return bp, nil
		}
		if err != nil {
			*bp = b
			return bp, err
		}
	}
}

// queryTimeout returns the first ?timeout= value, as
// r.URL.Query().Get("timeout") does, without building the map for the one
// query the API server sends ("timeout=10s"); a query with escapes or
// semicolons goes through url.ParseQuery.
func queryTimeout(r *http.Request) string {
	q := r.URL.RawQuery
	if strings.ContainsAny(q, "%+;") {
		return r.URL.Query().Get("timeout")
	}
	for q != "" {
		var kv string
		kv, q, _ = strings.Cut(q, "&")
		if k, v, _ := strings.Cut(kv, "="); k == "timeout" {
			return v
		}
	}
	return ""
}

// Review goroutine states.
const (
	reviewRunning int32 = iota
	reviewDone
	reviewAbandoned
)

// call is one request's review: its lease and the goroutine that runs the
// policies. Calls are pooled: a call goes back to the pool once both the
// handler and the review goroutine are done with it, which is after the
// handler has read the result, or, for an abandoned review, when the
// policy finally returns.
type call struct {
	h     *handler
	ls    lease
	rctx  logging.RequestContext // the review's context: the deadline's, with its logger
	ctx   context.Context
	req   *Request
	state atomic.Int32
	done  chan struct{} // one token when the review finished first
	out   Outcome
	err   error
	// Set by run before it marks the review abandoned (the state CAS
	// orders these writes before the review goroutine's reads):
	// released says the lease was given back at the answer, counted in
	// Limits' released set with ls.reserved (the handler released a copy
	// of ls, so ls still says how many bytes); abandonedAt is when.
	released    bool
	abandonedAt time.Time
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

func (c *call) recycle() {
	c.h, c.ls, c.ctx, c.req, c.out, c.err = nil, lease{}, nil, nil, Outcome{}, nil
	c.rctx.Clear()
	c.released, c.abandonedAt = false, time.Time{}
	c.state.Store(reviewRunning)
	callPool.Put(c)
}

// run runs the webhook: on the caller's goroutine when every hook is
// Bounded, else on its own goroutine so that a policy that ignores ctx
// still cannot hold the answer past the deadline. When the deadline
// passes first, the review is abandoned: the answer is a 500, ctx is
// cancelled (a policy that honours it stops), and the goroutine keeps the
// call until the policy returns (abandoned=true: the caller must neither
// release the lease nor reuse the call).
//
// An abandoned review gives its in-flight slot and body bytes back at the
// answer, when Limits admit it among the bounded set of abandoned reviews
// that may (takeReleased): a runaway policy must not starve every other
// request of the budget it can no longer use. This releases the
// accounting, not memory anyone still reads: the pooled body buffer went
// back to the pool right after decoding (decodeRequest copies what it
// keeps), and the policy reads only that decoded copy, which the garbage
// collector frees when the policy returns. The bytes are counted in
// Limits.AbandonedBytes meanwhile, bounded by takeReleased. Beyond that
// bound the lease stays held until the policy returns, as before.
func (c *call) run(ctx context.Context, req *Request) (out Outcome, abandoned bool, err error) {
	if c.h.inline {
		// Every hook is Bounded: the review ends soon after ctx does,
		// so it runs here, without a handoff to a review goroutine and
		// back (see Bounded for what that costs).
		out, err = c.h.wh.review(ctx, req, reviewForAnswerBounded)
		return out, false, err
	}
	c.ctx, c.req = ctx, req
	c.start()
	select {
	case <-c.done:
		return c.out, false, c.err
	case <-ctx.Done():
		lim := c.h.opts.Limits
		held := c.ls // the handler's copy: after the CAS the call is the review goroutine's
		released := lim.takeReleased(held.reserved)
		c.released = released
		c.abandonedAt = time.Now()
		// Counted before the CAS: the review goroutine may end and
		// uncount it right after.
		lim.abandoned.Add(1)
		if c.state.CompareAndSwap(reviewRunning, reviewAbandoned) {
			lim.abandonedTotal.Add(1)
			// The local copy: after the CAS the review goroutine may
			// already have recycled c (and cleared c.released), and a
			// stale false here would leak the in-flight slot.
			if released {
				held.release()
			}
			return Outcome{}, true, fmt.Errorf("no decision before the deadline: %w", ctx.Err())
		}
		// The policy returned just as the deadline passed: use its answer.
		lim.abandoned.Add(-1)
		if c.released {
			lim.returnReleased(held.reserved)
			c.released = false
		}
		<-c.done
		return c.out, false, c.err
	}
}

// maxIdleReviewers bounds the review goroutines kept parked between
// requests. A review goroutine's stack grows past its initial 8 KiB on
// every request (the envelope and the policies' decoders are deep), so a
// fresh goroutine per request pays for the growth each time; a reused one
// keeps its stack until the garbage collector shrinks it. Busy reviewers
// are bounded by Limits (MaxInFlight); idle ones by this.
const maxIdleReviewers = 32

// idleReviewers holds the job channels of parked review goroutines.
var idleReviewers = make(chan chan *call, maxIdleReviewers)

// start runs c.review on an idle review goroutine, or a new one.
func (c *call) start() {
	select {
	case jobs := <-idleReviewers:
		jobs <- c // buffered: never blocks
	default:
		go reviewer(c)
	}
}

// reviewer runs reviews until there are maxIdleReviewers idle ones
// already when it finishes one: then it exits.
func reviewer(c *call) {
	jobs := make(chan *call, 1)
	for {
		c.review()
		select {
		case idleReviewers <- jobs:
		default:
			return
		}
		c = <-jobs
	}
}

func (c *call) review() {
	c.out, c.err = c.h.wh.review(c.ctx, c.req, reviewForAnswer)
	if c.state.CompareAndSwap(reviewRunning, reviewDone) {
		c.done <- struct{}{}
		return
	}
	lim := c.h.opts.Limits
	lim.abandoned.Add(-1)
	if c.released {
		lim.returnReleased(c.ls.reserved)
	} else {
		c.ls.release()
	}
	if f := c.h.opts.AbandonedRan; f != nil {
		f(c.h.wh.Path, time.Since(c.abandonedAt))
	}
	c.recycle()
}
