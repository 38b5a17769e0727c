package crmanager

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// DefaultDrain is how long Drain keeps a stopping webhook server answering:
// longer than kube-proxy's minimum sync period (1 s) and EndpointSlice
// propagation, shorter than a pod's default termination grace (30 s) and
// Kueue's chart's (10 s).
const DefaultDrain = 5 * time.Second

// DrainingServer is a controller-runtime webhook.Server that keeps
// answering for a while after the manager is told to stop. Build it with
// Drain.
type DrainingServer struct {
	webhook.Server
	drain    time.Duration
	draining atomic.Bool
}

// Drain wraps srv (e.g. webhook.NewServer(opts)) so that a replica being
// stopped does not fail the API server's calls. Without it, a manager's
// webhook server closes its listener the moment SIGTERM cancels the
// manager's context, while kube-proxy and the API server still send it
// calls: on a rollout restart of Kueue's manager that is `connection
// refused` for new connections and `write: broken pipe`, `EOF` or `http:
// server closed idle connection` for the API server's pooled keep-alive
// connections, which it keeps reusing to terminating pods (kubernetes
// #127335). Wrapped, the server goes on serving for drain (DefaultDrain
// when drain <= 0) after the context ends, answers every request in that
// time with `Connection: close` (an HTTP/2 server sends GOAWAY) so the API
// server retires its connections to this replica one by one and dials the
// Service anew, and only then shuts down. ReadyzCheck fails meanwhile. Set
// the manager's GracefulShutdownTimeout (default 30 s) and the pod's
// terminationGracePeriodSeconds above drain.
func Drain(srv webhook.Server, drain time.Duration) *DrainingServer {
	if drain <= 0 {
		drain = DefaultDrain
	}
	return &DrainingServer{Server: srv, drain: drain}
}

// Unwrap returns the wrapped server.
func (s *DrainingServer) Unwrap() webhook.Server { return s.Server }

// Draining reports whether the server is past its context's end, draining.
func (s *DrainingServer) Draining() bool { return s.draining.Load() }

// Register registers hook on the wrapped server, answering with
// `Connection: close` while draining.
func (s *DrainingServer) Register(path string, hook http.Handler) {
	s.Server.Register(path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			w.Header().Set("Connection", "close")
		}
		hook.ServeHTTP(w, r)
	}))
}

// Start runs the wrapped server until drain after ctx ends, then returns
// what the wrapped server's Start returns (it shuts down gracefully).
func (s *DrainingServer) Start(ctx context.Context) error {
	inner, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		s.draining.Store(true)
		t := time.NewTimer(s.drain)
		defer t.Stop()
		select {
		case <-t.C:
		case <-done:
		}
		cancel()
	}()
	return s.Server.Start(inner)
}
