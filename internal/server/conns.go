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

// limitListener closes connections accepted beyond max open ones at once,
// instead of leaving them in the kernel's accept queue as
// golang.org/x/net/netutil.LimitListener does: a caller over the bound gets
// an immediate connection error (the API server then applies the webhook's
// failurePolicy) rather than a hang until its own timeout.
type limitListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused func() // called for each connection closed at accept
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			_ = c.Close()
			if l.refused != nil {
				l.refused()
			}
			continue
		}
		return &countedConn{Conn: c, l: l}, nil
	}
}

type countedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}

// connKey carries the request's connection in its context (ConnContext).
type connKey struct{}

// tracker knows, for each admission connection, which of its requests are
// still reading their body and how many are past it (reviewing or
// answering). At shutdown, body reads are interrupted and connections with
// no request past its body are closed: a client that stalls mid-request is
// cut off instead of holding the drain for the whole grace period, while
// reviews already decided run to their answer.
type tracker struct {
	mu       sync.Mutex
	conns    map[net.Conn]*connRequests
	stopping bool
}

type connRequests struct {
	reading   map[*trackedRequest]struct{}
	reviewing int
}

type trackedRequest struct {
	rc      *http.ResponseController
	conn    net.Conn
	reading bool
}

func newTracker() *tracker { return &tracker{conns: map[net.Conn]*connRequests{}} }

// connState is the http.Server ConnState hook.
func (t *tracker) connState(c net.Conn, st http.ConnState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch st {
	case http.StateNew:
		if t.stopping {
			_ = c.Close()
			return
		}
		t.conns[c] = &connRequests{reading: map[*trackedRequest]struct{}{}}
	case http.StateClosed, http.StateHijacked:
		delete(t.conns, c)
	}
}

func (t *tracker) connContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// wrap tracks next's requests: reading until their body returns an error
// or EOF, reviewing after that until next returns.
func (t *tracker) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(connKey{}).(net.Conn)
		tr := &trackedRequest{rc: http.NewResponseController(w), conn: c, reading: true}
		t.mu.Lock()
		cr := t.conns[c]
		if cr != nil {
			cr.reading[tr] = struct{}{}
		}
		stopping := t.stopping
		t.mu.Unlock()
		if stopping {
			_ = tr.rc.SetReadDeadline(time.Now())
		}
		defer t.done(tr)
		r.Body = &trackedBody{ReadCloser: r.Body, t: t, tr: tr}
		next.ServeHTTP(w, r)
	})
}

// bodyRead moves tr from reading to reviewing.
func (t *tracker) bodyRead(tr *trackedRequest) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !tr.reading {
		return
	}
	tr.reading = false
	if cr := t.conns[tr.conn]; cr != nil {
		delete(cr.reading, tr)
		cr.reviewing++
	}
}

func (t *tracker) done(tr *trackedRequest) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cr := t.conns[tr.conn]
	if cr == nil {
		return
	}
	if tr.reading {
		delete(cr.reading, tr)
	} else {
		cr.reviewing--
	}
}

// sweep interrupts every body read and closes every connection with no
// request past its body; from now on new connections are closed too.
func (t *tracker) sweep() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopping = true
	now := time.Now()
	for c, cr := range t.conns {
		for tr := range cr.reading {
			_ = tr.rc.SetReadDeadline(now)
		}
		if cr.reviewing == 0 && len(cr.reading) == 0 {
			_ = c.Close()
		}
	}
}

type trackedBody struct {
	io.ReadCloser
	t  *tracker
	tr *trackedRequest
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.t.bodyRead(b.tr)
	}
	return n, err
}
