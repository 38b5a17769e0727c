// Command foreign is "another controller's webhook" for the seed
// scenarios: a stand-in for the admission webhook of LeaderWorkerSet,
// Kueue or OpenKruise, installed next to kadmit in a test cluster. It
// allows every AdmissionReview (admission.k8s.io/v1) it is sent and, on
// mutating paths, marks pods with the annotation
// foreign.kadmit.test/served-by: <name>, so a test sees which webhooks a
// pod went through and in which order relative to kadmit's.
//
//	foreign --cert-dir DIR [--port 9443] [--health-port 8081] [--name NAME] [--not-ready-for DURATION]
//
// TLS: DIR/tls.crt and DIR/tls.key (a kubernetes.io/tls Secret mounted as
// a volume) are read on every handshake, so a rotated Secret is served
// without a restart, as controller-runtime's certwatcher does.
//
// Health: plain HTTP on --health-port, /healthz (always 200 while the
// process runs) and /readyz (200 once the webhook port listens).
// --not-ready-for keeps /readyz at 503 and the webhook port closed for
// that long after start, to reproduce a webhook configuration registered
// before its backend is Ready.
//
// Paths: any. A path starting with /validate is answered as a validating
// webhook (allowed, no patch: the API server rejects a validating
// response that carries one); any other path as a mutating one (allowed,
// plus the pod annotation patch when the object is a core/v1 Pod). One log
// line per call: method, path, uid.
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
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AnnotationServedBy is the annotation the mutating paths add to pods.
const AnnotationServedBy = "foreign.kadmit.test/served-by"

// maxBody bounds an AdmissionReview: the API server's own request limit is
// 3 MiB, so a larger body is not a review.
const maxBody = 3 << 20

type config struct {
	certDir     string
	addr        string // webhook, TLS
	healthAddr  string // health, plain HTTP
	name        string
	notReadyFor time.Duration
	// onListen, if set, is told each listener's address (tests use port 0).
	onListen func(which string, a net.Addr)
}

func main() {
	var c config
	var port, healthPort int
	flag.StringVar(&c.certDir, "cert-dir", "", "directory holding tls.crt and tls.key (re-read on each handshake)")
	flag.IntVar(&port, "port", 9443, "webhook HTTPS port")
	flag.IntVar(&healthPort, "health-port", 8081, "plain HTTP port for /healthz and /readyz")
	flag.StringVar(&c.name, "name", "foreign", "identity, the value of the "+AnnotationServedBy+" annotation")
	flag.DurationVar(&c.notReadyFor, "not-ready-for", 0, "keep /readyz at 503 and the webhook port closed this long")
	flag.Parse()
	if c.certDir == "" {
		fmt.Fprintln(os.Stderr, "foreign: --cert-dir is required")
		os.Exit(2)
	}
	c.addr = ":" + strconv.Itoa(port)
	c.healthAddr = ":" + strconv.Itoa(healthPort)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := log.New(os.Stdout, "", log.LstdFlags|log.LUTC)
	if err := run(ctx, c, logger); err != nil {
		logger.Printf("foreign %s: %v", c.name, err)
		os.Exit(1)
	}
}

// run serves until ctx is done, then shuts both servers down and returns
// nil; it returns an error when a port cannot be bound or a server fails.
func run(ctx context.Context, c config, logger *log.Logger) error {
	var ready atomic.Bool
	health := http.NewServeMux()
	health.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	health.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	hl, err := net.Listen("tcp", c.healthAddr)
	if err != nil {
		return fmt.Errorf("health listener: %w", err)
	}
	if c.onListen != nil {
		c.onListen("health", hl.Addr())
	}
	hs := newServer(health, logger)
	errc := make(chan error, 2)
	go func() { errc <- serve(hs.Serve(hl)) }()
	defer shutdown(hs)
	logger.Printf("foreign %s: health on %s", c.name, hl.Addr())

	if c.notReadyFor > 0 {
		logger.Printf("foreign %s: not ready for %s", c.name, c.notReadyFor)
		select {
		case <-time.After(c.notReadyFor):
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		}
	}

	wl, err := net.Listen("tcp", c.addr)
	if err != nil {
		return fmt.Errorf("webhook listener: %w", err)
	}
	if c.onListen != nil {
		c.onListen("webhook", wl.Addr())
	}
	ws := newServer(&webhook{name: c.name, log: logger}, logger)
	ws.TLSConfig = &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: certLoader(c.certDir),
	}
	go func() { errc <- serve(ws.ServeTLS(wl, "", "")) }()
	defer shutdown(ws)
	ready.Store(true)
	logger.Printf("foreign %s: webhook on %s (TLS from %s)", c.name, wl.Addr(), c.certDir)

	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

func newServer(h http.Handler, logger *log.Logger) *http.Server {
	// Timeouts well under the API server's webhook timeout (10 s by
	// default, 30 s at most) so a stuck client cannot hold a connection.
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       90 * time.Second,
		ErrorLog:          logger,
	}
}

func serve(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func shutdown(s *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.Shutdown(ctx)
}

// certLoader reads the key pair on every handshake: a Secret volume is
// updated in place (an atomic symlink swap), so the next handshake serves
// the rotated certificate. Handshakes are few (the API server keeps
// connections alive), so the reads cost nothing that matters.
func certLoader(dir string) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
		if err != nil {
			return nil, fmt.Errorf("load serving certificate: %w", err)
		}
		return &c, nil
	}
}

type webhook struct {
	name string
	log  *log.Logger
}

func (h *webhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		h.log.Printf("%s %s uid=- rejected: method", r.Method, r.URL.Path)
		http.Error(w, "AdmissionReview is POSTed", http.StatusMethodNotAllowed)
		return
	}
	var review admissionv1.AdmissionReview
	body := http.MaxBytesReader(w, r.Body, maxBody)
	if err := json.NewDecoder(body).Decode(&review); err != nil {
		h.log.Printf("%s %s uid=- rejected: %v", r.Method, r.URL.Path, err)
		code := http.StatusBadRequest
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			code = http.StatusRequestEntityTooLarge
		}
		http.Error(w, "decode AdmissionReview: "+err.Error(), code)
		return
	}
	if review.APIVersion != admissionv1.SchemeGroupVersion.String() || review.Kind != "AdmissionReview" || review.Request == nil {
		h.log.Printf("%s %s uid=- rejected: not an admission.k8s.io/v1 AdmissionReview request", r.Method, r.URL.Path)
		http.Error(w, "want an admission.k8s.io/v1 AdmissionReview with a request", http.StatusBadRequest)
		return
	}
	req := review.Request
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	patched := false
	if !strings.HasPrefix(r.URL.Path, "/validate") && isPod(req) {
		p, err := annotatePatch(req.Object.Raw, h.name)
		if err != nil {
			// Not a pod after all (or not JSON): allow untouched rather
			// than fail a request that kadmit's scenario does not target.
			h.log.Printf("%s %s uid=%s: no patch: %v", r.Method, r.URL.Path, req.UID, err)
		} else {
			pt := admissionv1.PatchTypeJSONPatch
			resp.Patch, resp.PatchType, patched = p, &pt, true
		}
	}
	h.log.Printf("%s %s uid=%s %s %s/%s patched=%t", r.Method, r.URL.Path, req.UID, req.Operation, req.Namespace, req.Name, patched)
	out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(&out); err != nil {
		h.log.Printf("%s %s uid=%s: write response: %v", r.Method, r.URL.Path, req.UID, err)
	}
}

// isPod reports whether the request carries a core/v1 Pod object to
// patch; DELETE and CONNECT carry none, and pods/binding and the like
// carry another kind.
func isPod(req *admissionv1.AdmissionRequest) bool {
	return req.Kind.Group == "" && req.Kind.Kind == "Pod" && len(req.Object.Raw) > 0
}

type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// annotatePatch returns the JSON Patch that sets AnnotationServedBy to
// name on the object in raw: an "add" of the one key when the object has
// annotations ("add" replaces an existing value), else an "add" of the
// whole map, since a JSON Patch cannot add a key under a missing parent.
func annotatePatch(raw []byte, name string) ([]byte, error) {
	var obj struct {
		Metadata *metav1.ObjectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("decode object: %w", err)
	}
	if obj.Metadata == nil {
		return nil, errors.New("object has no metadata")
	}
	op := jsonPatchOp{Op: "add", Path: "/metadata/annotations", Value: map[string]string{AnnotationServedBy: name}}
	if obj.Metadata.Annotations != nil {
		op = jsonPatchOp{Op: "add", Path: "/metadata/annotations/" + escapePointer(AnnotationServedBy), Value: name}
	}
	return json.Marshal([]jsonPatchOp{op})
}

// escapePointer escapes one JSON Pointer reference token (RFC 6901): "~"
// first, then "/", so "a/b" becomes "a~1b" and "~1" becomes "~01".
func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
