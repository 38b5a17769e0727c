// Command webhook is the small admission webhook server the diagcluster
// suite runs as real pods, one Deployment per failure class: it admits
// every AdmissionReview (admission.k8s.io/v1) it is sent, and can be made
// to misbehave the ways the watch must detect, by its flags alone (a
// Deployment rollout injects the fault, as a bad release would):
//
//	webhook --cert-dir DIR [--port 9443] [--health-port 8081] [--stall]
//
// TLS: DIR/tls.crt and DIR/tls.key, read on every handshake (a mounted
// Secret). --port other than the container port the Service targets makes
// a ready endpoint that refuses connections; --stall makes the webhook
// port accept TCP connections and never answer (a TLS handshake with it
// times out), holding at most maxStalled at once.
//
// Health: plain HTTP on --health-port, /healthz and /readyz, 200 while the
// process runs: readiness does not depend on the webhook port, so a
// misconfigured port still becomes a ready endpoint, as with a readiness
// probe on a separate health port (kubebuilder's layout).
//
// It needs nothing but the standard library, so its image builds in
// seconds (test/cluster/image).
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// maxBody bounds an AdmissionReview: the API server's own request limit is
// 3 MiB.
const maxBody = 3 << 20

// maxStalled bounds the connections --stall holds; more are closed at
// once.
const maxStalled = 64

type config struct {
	certDir    string
	addr       string
	healthAddr string
	stall      bool
	// onListen, if set, is told each listener's address (tests use port 0).
	onListen func(which string, a net.Addr)
}

func main() {
	var c config
	var port, healthPort int
	flag.StringVar(&c.certDir, "cert-dir", "", "directory holding tls.crt and tls.key (re-read on each handshake)")
	flag.IntVar(&port, "port", 9443, "webhook HTTPS port")
	flag.IntVar(&healthPort, "health-port", 8081, "plain HTTP port for /healthz and /readyz")
	flag.BoolVar(&c.stall, "stall", false, "accept connections on the webhook port and never answer")
	flag.Parse()
	if c.certDir == "" && !c.stall {
		fmt.Fprintln(os.Stderr, "webhook: --cert-dir is required")
		os.Exit(2)
	}
	c.addr = ":" + strconv.Itoa(port)
	c.healthAddr = ":" + strconv.Itoa(healthPort)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := log.New(os.Stdout, "", log.LstdFlags|log.LUTC)
	if err := run(ctx, c, logger); err != nil {
		logger.Printf("webhook: %v", err)
		os.Exit(1)
	}
}

// run serves until ctx is done and returns nil, or returns the error of a
// listener that could not be bound or a server that failed.
func run(ctx context.Context, c config, logger *log.Logger) error {
	health := http.NewServeMux()
	ok := func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") }
	health.HandleFunc("/healthz", ok)
	health.HandleFunc("/readyz", ok)
	hl, err := net.Listen("tcp", c.healthAddr)
	if err != nil {
		return fmt.Errorf("health listener: %w", err)
	}
	if c.onListen != nil {
		c.onListen("health", hl.Addr())
	}
	hs := newServer(health, logger)
	errc := make(chan error, 2)
	go func() { errc <- serveErr(hs.Serve(hl)) }()
	defer shutdown(hs)

	wl, err := net.Listen("tcp", c.addr)
	if err != nil {
		return fmt.Errorf("webhook listener: %w", err)
	}
	if c.onListen != nil {
		c.onListen("webhook", wl.Addr())
	}
	if c.stall {
		s := newStaller(wl, maxStalled)
		defer s.close()
		go s.run()
		logger.Printf("webhook: stalling every connection on %s", wl.Addr())
	} else {
		ws := newServer(http.HandlerFunc(admit), logger)
		ws.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certLoader(c.certDir)}
		go func() { errc <- serveErr(ws.ServeTLS(wl, "", "")) }()
		defer shutdown(ws)
		logger.Printf("webhook: serving on %s (TLS from %s)", wl.Addr(), c.certDir)
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

func newServer(h http.Handler, logger *log.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       90 * time.Second,
		// The watch handshakes and hangs up without a request: net/http
		// would log each such connection.
		ErrorLog: log.New(io.Discard, "", 0),
	}
}

func serveErr(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func shutdown(s *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.Shutdown(ctx)
}

// certLoader reads the key pair on every handshake, so a Secret volume
// updated in place is served without a restart.
func certLoader(dir string) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
		if err != nil {
			return nil, fmt.Errorf("load serving certificate: %w", err)
		}
		return &c, nil
	}
}

// review is the part of an AdmissionReview this server reads and writes.
type review struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Request    *struct {
		UID string `json:"uid"`
	} `json:"request,omitempty"`
	Response *response `json:"response,omitempty"`
}

type response struct {
	UID     string `json:"uid"`
	Allowed bool   `json:"allowed"`
}

// admit answers an admission.k8s.io/v1 AdmissionReview with allowed: true
// and no patch (valid for mutating and validating webhooks alike).
func admit(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "AdmissionReview is POSTed", http.StatusMethodNotAllowed)
		return
	}
	var rev review
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&rev); err != nil || rev.Request == nil ||
		rev.APIVersion != "admission.k8s.io/v1" || rev.Kind != "AdmissionReview" {
		http.Error(w, "want an admission.k8s.io/v1 AdmissionReview with a request", http.StatusBadRequest)
		return
	}
	out := review{APIVersion: rev.APIVersion, Kind: rev.Kind, Response: &response{UID: rev.Request.UID, Allowed: true}}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&out)
}

// staller accepts connections and never answers: a TLS handshake with it
// times out. It reads (and drops) what the peer sends until the peer hangs
// up; it holds at most max connections, closing further ones at once.
type staller struct {
	ln     net.Listener
	max    int
	mu     sync.Mutex
	conns  map[net.Conn]bool
	closed bool
}

func newStaller(ln net.Listener, max int) *staller {
	return &staller{ln: ln, max: max, conns: map[net.Conn]bool{}}
}

func (s *staller) run() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed || len(s.conns) >= s.max {
			s.mu.Unlock()
			_ = c.Close()
			continue
		}
		s.conns[c] = true
		s.mu.Unlock()
		go func() {
			_, _ = io.Copy(io.Discard, c)
			_ = c.Close()
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// held is the number of connections held.
func (s *staller) held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func (s *staller) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for c := range s.conns {
		_ = c.Close()
	}
}
