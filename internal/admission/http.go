package admission

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"sync"
	"time"
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
	// Observe, when set, is called once per request after the answer is written.
	Observe func(Decision)
}

// NewHandler serves wh over HTTP: it checks Content-Type (415 otherwise), bounds
// the body (413), decodes AdmissionReview v1 or v1beta1 (400 with a one-line
// reason), bounds the review by the API server's ?timeout= and answers with the
// request's apiVersion. A panicking policy, a review that misses its deadline
// or an encoding failure is answered with HTTP 500 so the webhook's
// failurePolicy decides, never with an invented admission decision.
func NewHandler(wh *Webhook, opts HandlerOptions) http.Handler {
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = DefaultMaxRequestBytes
	}
	return &handler{wh: wh, opts: opts}
}

type handler struct {
	wh   *Webhook
	opts HandlerOptions
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	d := Decision{Webhook: h.wh.Path}
	defer func() {
		d.Latency = time.Since(start)
		if h.opts.Observe != nil {
			h.opts.Observe(d)
		}
	}()
	fail := func(code int, err error) {
		d.HTTPCode, d.Err = code, err
		http.Error(w, err.Error(), code)
	}

	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		fail(http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed: AdmissionReview is sent with POST", r.Method))
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		fail(http.StatusUnsupportedMediaType, fmt.Errorf("Content-Type %q is not application/json", r.Header.Get("Content-Type")))
		return
	}
	buf := bodyPool.Get().(*bytes.Buffer)
	defer putBody(buf)
	buf.Reset()
	if n := r.ContentLength; n > 0 && n <= h.opts.MaxRequestBytes {
		buf.Grow(int(n) + bytes.MinRead)
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, h.opts.MaxRequestBytes))
	body := buf.Bytes()
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			fail(http.StatusRequestEntityTooLarge, fmt.Errorf("AdmissionReview body exceeds %d bytes", h.opts.MaxRequestBytes))
			return
		}
		fail(http.StatusBadRequest, fmt.Errorf("read AdmissionReview body: %w", err))
		return
	}
	review, err := DecodeReview(body)
	if err != nil {
		fail(http.StatusBadRequest, err)
		return
	}
	req := &Request{AdmissionRequest: *review.Request}
	d.UID, d.Kind, d.Namespace, d.Name, d.Operation = string(req.UID), req.Kind.Kind, req.Namespace, req.Name, string(req.Operation)

	timeout := DefaultTimeout
	if t := r.URL.Query().Get("timeout"); t != "" {
		if pt, err := time.ParseDuration(t); err == nil && pt > 0 {
			timeout = pt
		}
	}
	// Answer a little before the API server gives up, so a slow policy shows
	// up as our 500 (logged, counted) rather than as a bare client timeout.
	ctx, cancel := context.WithTimeout(r.Context(), timeout-timeout/10)
	defer cancel()

	out, err := h.review(ctx, req)
	if err != nil {
		var pe *PanicError
		if errors.As(err, &pe) {
			d.Panic = pe
		}
		fail(http.StatusInternalServerError, fmt.Errorf("review %s: %w", req.UID, err))
		return
	}
	d.Allowed, d.Patched, d.Policy = out.Response.Allowed, out.Response.Patch != nil, out.Policy
	if res := out.Response.Result; res != nil {
		d.ResultCode, d.Message = res.Code, res.Message
	}
	payload, err := EncodeResponse(review.APIVersion, out.Response)
	if err != nil {
		fail(http.StatusInternalServerError, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	d.HTTPCode = http.StatusOK
	_, _ = w.Write(payload)
}

// bodyPool holds request body buffers: DecodeReview copies what it keeps, so
// a buffer is free again once the request is decoded, and reusing it saves
// the several growing allocations io.ReadAll makes for each 5 KB body.
var bodyPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBody keeps buffers grown by rare huge objects (up to 7 MiB) from
// staying in the pool.
const maxPooledBody = 256 << 10

func putBody(b *bytes.Buffer) {
	if b.Cap() <= maxPooledBody {
		bodyPool.Put(b)
	}
}

// review runs the webhook on its own goroutine so that a policy that ignores
// ctx still cannot hold the answer past the deadline. The goroutine finishes
// on its own; its result is then discarded.
func (h *handler) review(ctx context.Context, req *Request) (Outcome, error) {
	type result struct {
		out Outcome
		err error
	}
	ch := make(chan result, 1)
	go func() {
		out, err := h.wh.review(ctx, req, false)
		ch <- result{out, err}
	}()
	select {
	case res := <-ch:
		return res.out, res.err
	case <-ctx.Done():
		return Outcome{}, fmt.Errorf("no decision before the deadline: %w", ctx.Err())
	}
}
