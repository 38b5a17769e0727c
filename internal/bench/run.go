package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kadmit/kadmit/internal/admission"
)

// Error kinds, the keys of Report.Errors. A request counts under exactly one.
const (
	KindConnection  = "connection"   // dial refused or reset, connection closed early
	KindTLS         = "tls"          // handshake failed: untrusted certificate, wrong name, no common protocol
	KindTimeout     = "timeout"      // no full answer within Options.Timeout
	KindHTTP4xx     = "http_4xx"     // HTTP status 400..499
	KindHTTP5xx     = "http_5xx"     // HTTP status 500..599
	KindHTTPOther   = "http_other"   // any other status but 200 (redirects are not followed)
	KindBadJSON     = "bad_json"     // body is not JSON, or longer than MaxResponseBytes
	KindBadReview   = "bad_review"   // not an AdmissionReview of the request's apiVersion, no response, or no allowed
	KindUIDMismatch = "uid_mismatch" // response.uid is not the request's uid
	KindBadPatch    = "bad_patch"    // patch not base64 of a JSONPatch array, or patchType not JSONPatch
)

type errKind uint8

const (
	kindOK errKind = iota
	kConnection
	kTLS
	kTimeout
	kHTTP4xx
	kHTTP5xx
	kHTTPOther
	kBadJSON
	kBadReview
	kUIDMismatch
	kBadPatch
	numKinds
)

var kindNames = [numKinds]string{"", KindConnection, KindTLS, KindTimeout, KindHTTP4xx, KindHTTP5xx, KindHTTPOther, KindBadJSON, KindBadReview, KindUIDMismatch, KindBadPatch}

// Run loads opts.URL until opts.Requests requests have completed or
// opts.Duration has passed, whichever comes first, with opts.Concurrency
// requests in flight; requests in flight when the duration ends are waited
// for (at most opts.Timeout). Cancelling ctx stops the run early: requests it
// aborts are not counted and Report.StoppedBy is "interrupted".
//
// Run returns an error only when it cannot start: invalid options (wrapping
// ErrOptions), a target that is not loopback (wrapping ErrRemoteTarget), or a
// host that does not resolve. Failed requests are counted in the Report.
func Run(ctx context.Context, opts Options) (*Report, error) {
	o, err := opts.normalize()
	if err != nil {
		return nil, err
	}
	tmpl, err := newTemplate(o.Manifest, o.APIVersion, o.Operation)
	if err != nil {
		return nil, err
	}
	if err := checkTarget(ctx, o.URL, o.AllowRemote); err != nil {
		return nil, err
	}
	target, _ := url.Parse(o.URL) // parsed by normalize already

	r := &runner{opts: o, tmpl: tmpl, url: target}
	r.client = r.newClient()
	defer r.client.CloseIdleConnections()
	r.shards = make([]histShard, min(o.Concurrency, 2*runtime.GOMAXPROCS(0)))

	start := time.Now()
	// stop ends the issuing of new requests; requests use ctx so that those in
	// flight at the deadline still finish and count.
	stop, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	progressDone := make(chan struct{})
	var progressWG sync.WaitGroup
	if o.Progress != nil {
		progressWG.Go(func() { r.progress(start, progressDone) })
	}
	// With HTTP/2, workers starting together would each dial a connection;
	// the API server multiplexes its calls over one, so the first request
	// opens it alone and the other workers start once it has an answer.
	firstDone := make(chan struct{})
	openFirst := sync.OnceFunc(func() { close(firstDone) })
	if !o.HTTP2 {
		openFirst()
	}
	var wg sync.WaitGroup
	for i := range int(min(int64(o.Concurrency), o.Requests)) {
		wg.Go(func() {
			if i == 0 {
				defer openFirst() // also when it never sends
				r.work(ctx, stop, &r.shards[0], openFirst)
				return
			}
			select {
			case <-firstDone:
			case <-stop.Done():
				return
			}
			r.work(ctx, stop, &r.shards[i%len(r.shards)], nil)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(progressDone)
	progressWG.Wait()

	rep := &Report{
		URL:         o.URL,
		HTTP2:       o.HTTP2,
		APIVersion:  o.APIVersion,
		Operation:   string(o.Operation),
		Kind:        tmpl.kind,
		BodyBytes:   tmpl.size(),
		Concurrency: o.Concurrency,
		Requests:    r.completed.Load(),
		Errors:      map[string]int64{},
		Allowed:     r.allowed.Load(),
		Denied:      r.denied.Load(),
		Patched:     r.patched.Load(),
		Connections: r.conns.Load(),
		Duration:    elapsed,
		hist:        &histogram{},
	}
	if p := r.proto.Load(); p != nil {
		rep.Protocol = *p
	}
	for k := kindOK + 1; k < numKinds; k++ {
		if n := r.kinds[k].Load(); n > 0 {
			rep.Errors[kindNames[k]] = n
		}
	}
	for i := range r.shards {
		rep.hist.merge(&r.shards[i].h)
	}
	switch {
	case ctx.Err() != nil:
		rep.StoppedBy = "interrupted"
	case rep.Requests >= o.Requests:
		rep.StoppedBy = "requests"
	default:
		rep.StoppedBy = "duration"
	}
	return rep, nil
}

type histShard struct {
	mu sync.Mutex
	h  histogram
}

type runner struct {
	opts   Options
	tmpl   *template
	url    *url.URL
	client *http.Client
	shards []histShard

	issued    atomic.Int64
	completed atomic.Int64
	failed    atomic.Int64
	allowed   atomic.Int64
	denied    atomic.Int64
	patched   atomic.Int64
	conns     atomic.Int64
	kinds     [numKinds]atomic.Int64
	proto     atomic.Pointer[string]
	// known is the answers already checked in full, split around their
	// uid (see check); next picks the slot the next one replaces.
	known [maxKnownAnswers]atomic.Pointer[knownAnswer]
	next  atomic.Uint32
}

// maxKnownAnswers bounds the answers check remembers: one per distinct
// answer of a run (a mixed run alternates three paths), so a run of any
// length keeps a few kilobytes.
const maxKnownAnswers = 8

// knownAnswer is an answer that passed every check, as the bytes before
// and after its uid, with the decision it carried.
type knownAnswer struct {
	prefix, suffix   []byte
	allowed, patched bool
}

// newClient builds a keep-alive client that speaks only HTTP/1.1, or only
// HTTP/2 with opts.HTTP2, never through a proxy, never following redirects,
// and (unless AllowRemote) never dialing a non-loopback address.
func (r *runner) newClient() *http.Client {
	o := r.opts
	dialer := &net.Dialer{Timeout: o.Timeout, KeepAlive: 30 * time.Second}
	if !o.AllowRemote {
		dialer.Control = loopbackOnly
	}
	tr := &http.Transport{
		Proxy: nil, // measure the webhook, and keep the loopback promise
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err == nil {
				r.conns.Add(1)
			}
			return c, err
		},
		TLSClientConfig: &tls.Config{
			RootCAs:            o.RootCAs,
			InsecureSkipVerify: o.Insecure, //nolint:gosec // only with --insecure
			MinVersion:         tls.VersionTLS12,
		},
		TLSHandshakeTimeout: o.Timeout,
		MaxIdleConnsPerHost: o.Concurrency,
		// Without a cap, a request that finds its worker's connection not yet
		// back in the idle pool dials another: c workers would use up to 2c.
		MaxConnsPerHost: o.Concurrency,
		IdleConnTimeout: 90 * time.Second,
		// The API server does not ask for gzip; neither do we.
		DisableCompression: true,
		ForceAttemptHTTP2:  o.HTTP2,
	}
	protocols := new(http.Protocols)
	if o.HTTP2 {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetHTTP1(true)
		// Belt and braces: a non-nil TLSNextProto also keeps HTTP/2 off.
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	tr.Protocols = protocols
	return &http.Client{
		Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// work issues requests one at a time until stop is done or the request budget
// is spent. afterFirst, when set, is called once the first request is over.
func (r *runner) work(ctx, stop context.Context, shard *histShard, afterFirst func()) {
	uids := newUIDGen()
	var buf bytes.Buffer
	for stop.Err() == nil && r.issued.Add(1) <= r.opts.Requests {
		kind, lat, aborted := r.do(ctx, uids.next(), &buf)
		if afterFirst != nil {
			afterFirst()
			afterFirst = nil
		}
		if aborted {
			return
		}
		if kind == kindOK {
			shard.mu.Lock()
			shard.h.record(lat)
			shard.mu.Unlock()
		} else {
			r.kinds[kind].Add(1)
			r.failed.Add(1)
		}
		r.completed.Add(1)
	}
}

// do sends one review with uid and checks the answer. lat is the time from
// sending to the last byte of the answer. aborted reports that ctx (not the
// per-request timeout) ended the request, which then does not count.
func (r *runner) do(ctx context.Context, uid []byte, buf *bytes.Buffer) (kind errKind, lat time.Duration, aborted bool) {
	rctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, r.opts.URL, bytes.NewReader(r.tmpl.body(uid)))
	if err != nil { // the URL was parsed already: cannot happen
		return kConnection, 0, false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, */*")
	start := time.Now()
	resp, err := r.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, 0, true
		}
		return classifyTransport(err), 0, false
	}
	buf.Reset()
	_, err = buf.ReadFrom(io.LimitReader(resp.Body, MaxResponseBytes+1))
	_ = resp.Body.Close()
	lat = time.Since(start)
	if err != nil {
		if ctx.Err() != nil {
			return 0, 0, true
		}
		return classifyTransport(err), 0, false
	}
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode >= 500 && resp.StatusCode <= 599:
		return kHTTP5xx, lat, false
	case resp.StatusCode >= 400 && resp.StatusCode <= 499:
		return kHTTP4xx, lat, false
	default:
		return kHTTPOther, lat, false
	}
	if r.proto.Load() == nil {
		p := resp.Proto
		r.proto.CompareAndSwap(nil, &p)
	}
	if buf.Len() > MaxResponseBytes {
		return kBadJSON, lat, false
	}
	kind = r.check(buf.Bytes(), uid)
	return kind, lat, false
}

// reviewAnswer is the part of an AdmissionReview response the bench checks.
// Pointers tell "absent" from "zero".
type reviewAnswer struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Response   *struct {
		UID       string  `json:"uid"`
		Allowed   *bool   `json:"allowed"`
		Patch     *string `json:"patch"`
		PatchType *string `json:"patchType"`
	} `json:"response"`
}

// check validates one HTTP 200 answer to the request with uid and counts its
// decision.
//
// A server answers the same object with the same bytes but for the uid.
// Checking a mutating answer in full (decode the review, base64, decode
// the JSONPatch) costs the generator more CPU than producing it costs
// kadmit, and on a small machine the generator, not the server, would set
// the pace. So an answer that is byte for byte one already checked in
// full, with this request's uid where that one had its own, counts as
// that answer: the same review, decision and patch, for this uid. Any
// other answer is checked in full, and remembered when it passes.
func (r *runner) check(body, uid []byte) errKind {
	for i := range r.known {
		k := r.known[i].Load()
		if k == nil {
			continue
		}
		if len(body) == len(k.prefix)+len(uid)+len(k.suffix) && bytes.Equal(body[len(k.prefix):len(k.prefix)+len(uid)], uid) &&
			bytes.Equal(body[:len(k.prefix)], k.prefix) && bytes.Equal(body[len(k.prefix)+len(uid):], k.suffix) {
			r.count(k.allowed, k.patched)
			return kindOK
		}
	}
	allowed, patched, kind := r.checkFull(body, uid)
	if kind != kindOK {
		return kind
	}
	r.count(allowed, patched)
	r.remember(body, uid, allowed, patched)
	return kindOK
}

// remember keeps body, an answer that passed checkFull for uid, as a known
// answer when its uid appears in it exactly once and that place is the
// response's uid: the same bytes with another uid there must pass
// checkFull for that uid too (an escaped response.uid and the bare uid in,
// say, a warning would fail it).
func (r *runner) remember(body, uid []byte, allowed, patched bool) {
	if bytes.Count(body, uid) != 1 {
		return
	}
	i := bytes.Index(body, uid)
	k := &knownAnswer{prefix: bytes.Clone(body[:i]), suffix: bytes.Clone(body[i+len(uid):]), allowed: allowed, patched: patched}
	other := bytes.Clone(uid)
	for j, c := range other {
		if c != '-' {
			other[j] = "0123456789abcdef"[(strings.IndexByte("0123456789abcdef", c)+1)&15]
		}
	}
	probe := append(append(append([]byte{}, k.prefix...), other...), k.suffix...)
	if a2, p2, kind := r.checkFull(probe, other); kind != kindOK || a2 != allowed || p2 != patched {
		return
	}
	r.known[(r.next.Add(1)-1)%maxKnownAnswers].Store(k)
}

func (r *runner) count(allowed, patched bool) {
	if allowed {
		r.allowed.Add(1)
	} else {
		r.denied.Add(1)
	}
	if patched {
		r.patched.Add(1)
	}
}

// checkFull decodes and checks the answer body to the request with uid:
// an AdmissionReview of the request's apiVersion with a response for uid,
// and a patch, if any, that is base64 of a JSONPatch array.
func (r *runner) checkFull(body, uid []byte) (allowed, patched bool, kind errKind) {
	var a reviewAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return false, false, kBadJSON
	}
	if a.APIVersion != r.tmpl.apiVersion || a.Kind != admission.ReviewKind || a.Response == nil || a.Response.Allowed == nil {
		return false, false, kBadReview
	}
	if a.Response.UID != string(uid) {
		return false, false, kUIDMismatch
	}
	patched = a.Response.Patch != nil && *a.Response.Patch != ""
	if patched {
		if a.Response.PatchType == nil || *a.Response.PatchType != "JSONPatch" {
			return false, false, kBadPatch
		}
		patch, err := base64.StdEncoding.DecodeString(*a.Response.Patch)
		if err != nil || validJSONPatch(patch) != nil {
			return false, false, kBadPatch
		}
	}
	return *a.Response.Allowed, patched, kindOK
}

// validJSONPatch checks that patch is an RFC 6902 document: an array of
// operations, each with a known op, a JSON Pointer path and the members that
// op needs. It does not apply the patch.
func validJSONPatch(patch []byte) error {
	var ops []struct {
		Op    string          `json:"op"`
		Path  *string         `json:"path"`
		From  *string         `json:"from"`
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(patch, &ops); err != nil {
		return fmt.Errorf("not a JSONPatch array: %w", err)
	}
	pointer := func(p *string) bool { return p != nil && (*p == "" || (*p)[0] == '/') }
	for i, op := range ops {
		if !pointer(op.Path) {
			return fmt.Errorf("operation %d: path missing or not a JSON Pointer", i)
		}
		switch op.Op {
		case "add", "replace", "test":
			if op.Value == nil {
				return fmt.Errorf("operation %d: %s without value", i, op.Op)
			}
		case "remove":
		case "move", "copy":
			if !pointer(op.From) {
				return fmt.Errorf("operation %d: %s without a JSON Pointer from", i, op.Op)
			}
		default:
			return fmt.Errorf("operation %d: unknown op %q", i, op.Op)
		}
	}
	return nil
}

func classifyTransport(err error) errKind {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return kTimeout
	}
	var (
		verr  *tls.CertificateVerificationError
		rherr tls.RecordHeaderError
		alert tls.AlertError
		uaerr x509.UnknownAuthorityError
		hnerr x509.HostnameError
		ciErr x509.CertificateInvalidError
	)
	if errors.As(err, &verr) || errors.As(err, &rherr) || errors.As(err, &alert) ||
		errors.As(err, &uaerr) || errors.As(err, &hnerr) || errors.As(err, &ciErr) {
		return kTLS
	}
	return kConnection
}

// progress calls opts.Progress about once per second until done is closed.
func (r *runner) progress(start time.Time, done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last, lastAt := int64(0), start
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			n := r.completed.Load()
			rps := float64(n-last) / now.Sub(lastAt).Seconds()
			last, lastAt = n, now
			r.opts.Progress(Progress{Elapsed: now.Sub(start), Requests: n, Errors: r.failed.Load(), RPS: rps})
		}
	}
}
