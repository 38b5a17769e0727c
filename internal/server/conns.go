package server

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// limitListener bounds the connections open at once on one listener (the
// admission listener and the metrics/health listener share this code).
// At the bound it acts at once instead of leaving connections in the
// kernel's accept queue as golang.org/x/net/netutil.LimitListener does:
//
//   - evict false (admission): the new connection is closed, so a caller
//     over the bound gets an immediate connection error (the API server then
//     applies the webhook's failurePolicy) rather than a hang until its own
//     timeout.
//   - evict true (metrics and probes): an idle connection (no request in
//     progress: handshaking, waiting for headers, or kept alive between
//     requests) of the source address holding the most connections is closed
//     to make room, oldest first; only when every connection of that source
//     is busy, or the newcomer's source already holds as many as it, is the
//     newcomer closed instead. A flood of idle connections from one address
//     therefore never locks out another address: the kubelet's probes (one
//     fresh connection per probe, from the node's address) keep getting in
//     while the flooding address churns through its own connections. See
//     docs/security.md ("Bounds").
//
// Eviction needs the http.Server's ConnState to call connState, which
// tells busy from idle connections.
type limitListener struct {
	net.Listener
	max     int64
	evict   bool
	open    atomic.Int64 // read without mu by the metrics gauge
	refused func()       // called for each connection closed by the bound (refused or evicted)

	mu    sync.Mutex
	seq   uint64
	conns map[*countedConn]struct{}
	// bySource counts open connections per remote IP; at most max entries.
	bySource map[string]int
}

type countedConn struct {
	net.Conn
	l      *limitListener
	source string
	seq    uint64 // accept order: lower is older
	busy   bool   // a request is in progress (http.StateActive)
	closed bool
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		source := remoteIP(c.RemoteAddr())
		l.mu.Lock()
		if l.conns == nil {
			l.conns, l.bySource = map[*countedConn]struct{}{}, map[string]int{}
		}
		var victim *countedConn
		if l.open.Load() >= l.max {
			if l.evict {
				victim = l.victimLocked(source)
			}
			if victim == nil {
				l.mu.Unlock()
				_ = c.Close()
				l.countRefused()
				continue
			}
			l.forgetLocked(victim)
		}
		l.seq++
		cc := &countedConn{Conn: c, l: l, source: source, seq: l.seq}
		l.conns[cc] = struct{}{}
		l.bySource[source]++
		l.open.Add(1)
		l.mu.Unlock()
		if victim != nil {
			_ = victim.Conn.Close()
			l.countRefused()
		}
		return cc, nil
	}
}

func (l *limitListener) countRefused() {
	if l.refused != nil {
		l.refused()
	}
}

// victimLocked picks the oldest idle connection of the source holding the
// most connections, or nil when that source holds no more than source (the
// newcomer's) would after accepting, or has no idle connection.
func (l *limitListener) victimLocked(source string) *countedConn {
	heaviest, most := "", 0
	for s, n := range l.bySource {
		if n > most || (n == most && s < heaviest) {
			heaviest, most = s, n
		}
	}
	if l.bySource[source]+1 > most {
		return nil // the newcomer's source is (or would become) the heaviest
	}
	var victim *countedConn
	for c := range l.conns {
		if c.source == heaviest && !c.busy && (victim == nil || c.seq < victim.seq) {
			victim = c
		}
	}
	return victim
}

// forgetLocked removes c from the bookkeeping, once.
func (l *limitListener) forgetLocked(c *countedConn) {
	if c.closed {
		return
	}
	c.closed = true
	delete(l.conns, c)
	if n := l.bySource[c.source] - 1; n > 0 {
		l.bySource[c.source] = n
	} else {
		delete(l.bySource, c.source)
	}
	l.open.Add(-1)
}

// connState is the http.Server ConnState hook of a listener with evict:
// it marks connections busy while a request is in progress.
func (l *limitListener) connState(c net.Conn, st http.ConnState) {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok { // *tls.Conn
		c = tc.NetConn()
	}
	cc, ok := c.(*countedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	cc.busy = st == http.StateActive
	l.mu.Unlock()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.forgetLocked(c)
	c.l.mu.Unlock()
	return err
}

func remoteIP(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	return remoteHost(a.String())
}

// connKey carries the request's connection state (*connRequests) in its
// context (ConnContext).
type connKey struct{}

// tracker knows, for each admission connection, which of its requests are
// still reading their body and how many are past it (reviewing or
// answering). At shutdown, body reads are interrupted and connections with
// no request past its body are closed: a client that stalls mid-request is
// cut off instead of holding the drain for the whole grace period, while
// reviews already decided run to their answer.
//
// The tracker's own lock is taken once when a connection opens and once
// when it closes; each request locks only its connection's state, which
// no other connection touches. One lock for every request was the
// admission path's busiest shared lock: three acquisitions per request
// from every core.
type tracker struct {
	mu       sync.Mutex
	conns    map[net.Conn]*connRequests
	stopping atomic.Bool
}

// connRequests is one connection's requests. HTTP/1.1 serves one request
// at a time; an HTTP/2 connection at most its MaxConcurrentStreams.
type connRequests struct {
	mu        sync.Mutex
	reading   map[*trackedRequest]struct{}
	reviewing int
}

type trackedRequest struct {
	rc      *http.ResponseController
	cr      *connRequests
	reading bool
}

func newTracker() *tracker { return &tracker{conns: map[net.Conn]*connRequests{}} }

// connState is the http.Server ConnState hook.
func (t *tracker) connState(c net.Conn, st http.ConnState) {
	switch st {
	case http.StateNew:
		if t.stopping.Load() {
			_ = c.Close()
		}
	case http.StateClosed, http.StateHijacked:
		t.mu.Lock()
		delete(t.conns, c)
		t.mu.Unlock()
	}
}

// connContext is the http.Server ConnContext hook: it registers the
// connection (net/http calls it before ConnState's StateNew) and carries
// its state in the context of every request on it.
func (t *tracker) connContext(ctx context.Context, c net.Conn) context.Context {
	cr := &connRequests{reading: map[*trackedRequest]struct{}{}}
	t.mu.Lock()
	t.conns[c] = cr
	t.mu.Unlock()
	return context.WithValue(ctx, connKey{}, cr)
}

// wrap tracks next's requests: reading until their body returns an error
// or EOF, reviewing after that until next returns.
func (t *tracker) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cr, _ := r.Context().Value(connKey{}).(*connRequests)
		tr := &trackedRequest{rc: http.NewResponseController(w), cr: cr, reading: true}
		if cr != nil {
			cr.mu.Lock()
			cr.reading[tr] = struct{}{}
			cr.mu.Unlock()
		}
		// Read after registering: sweep sets stopping before it locks
		// each connection, so either sweep sees this request or this
		// request sees stopping.
		if t.stopping.Load() {
			_ = tr.rc.SetReadDeadline(time.Now())
		}
		defer tr.done()
		r.Body = &trackedBody{ReadCloser: r.Body, tr: tr}
		next.ServeHTTP(w, r)
	})
}

// bodyRead moves tr from reading to reviewing.
func (tr *trackedRequest) bodyRead() {
	cr := tr.cr
	if cr == nil {
		return
	}
	cr.mu.Lock()
	defer cr.mu.Unlock()
	if !tr.reading {
		return
	}
	tr.reading = false
	delete(cr.reading, tr)
	cr.reviewing++
}

func (tr *trackedRequest) done() {
	cr := tr.cr
	if cr == nil {
		return
	}
	cr.mu.Lock()
	defer cr.mu.Unlock()
	if tr.reading {
		delete(cr.reading, tr)
	} else {
		cr.reviewing--
	}
}

// sweep interrupts every body read and closes every connection with no
// request past its body; from now on new connections are closed too.
func (t *tracker) sweep() {
	t.stopping.Store(true)
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	for c, cr := range t.conns {
		cr.mu.Lock()
		for tr := range cr.reading {
			_ = tr.rc.SetReadDeadline(now)
		}
		idle := cr.reviewing == 0 && len(cr.reading) == 0
		cr.mu.Unlock()
		if idle {
			_ = c.Close()
		}
	}
}

type trackedBody struct {
	io.ReadCloser
	tr *trackedRequest
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.tr.bodyRead()
	}
	return n, err
}
