// Command reference serves the two comparison webhooks of `make bench`:
//
//	reference controller-runtime  pod-name and lifespan, written as a
//	                              controller-runtime user writes them
//	reference bare                a net/http TLS server that decodes only
//	                              the uid and answers allowed: the floor
//	reference certs DIR           a self-signed ECDSA certificate for
//	                              127.0.0.1 in DIR/tls.crt, DIR/tls.key
//
// It is its own Go module so that kadmit does not depend on it. Servers run
// until SIGINT or SIGTERM.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: reference controller-runtime|bare|certs [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	port := fs.Int("port", 9444, "HTTPS port on 127.0.0.1")
	certDir := fs.String("cert-dir", "", "directory with tls.crt and tls.key")
	_ = fs.Parse(os.Args[2:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "controller-runtime":
		err = serveControllerRuntime(ctx, *port, *certDir)
	case "bare":
		err = serveBare(ctx, *port, *certDir)
	case "certs":
		err = writeCert(fs.Arg(0))
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "reference:", err)
		os.Exit(1)
	}
}

// Policy settings of kadmit's seed profile.
const (
	forbiddenWord  = "offensive"
	labelRequested = "acme.com/lifespan-requested"
	taintKey       = "acme.com/lifespan-remaining"
	maxDays        = 14
)

func serveControllerRuntime(ctx context.Context, port int, certDir string) error {
	// controller-runtime logs through logr and complains once when no logger
	// is set; the benchmark wants no log output at all.
	log.SetLogger(logr.Discard())
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return err
	}
	decoder := admission.NewDecoder(scheme)
	srv := webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: certDir})
	srv.Register("/validate-pod", &admission.Webhook{Handler: admission.HandlerFunc(func(_ context.Context, req admission.Request) admission.Response {
		pod := &corev1.Pod{}
		if err := decoder.Decode(req, pod); err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
		name := pod.Name
		if name == "" {
			name = pod.GenerateName
		}
		if strings.Contains(name, forbiddenWord) {
			return admission.Denied(fmt.Sprintf("pod name contains %q", forbiddenWord))
		}
		return admission.Allowed("")
	})})
	srv.Register("/mutate-pod", &admission.Webhook{Handler: admission.HandlerFunc(func(_ context.Context, req admission.Request) admission.Response {
		pod := &corev1.Pod{}
		if err := decoder.Decode(req, pod); err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
		want, err := tolerations(pod.Labels)
		if err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
		for _, t := range want {
			if !hasToleration(pod.Spec.Tolerations, t) {
				pod.Spec.Tolerations = append(pod.Spec.Tolerations, t)
			}
		}
		marshaled, err := json.Marshal(pod)
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		return admission.PatchResponseFromRaw(req.Object.Raw, marshaled)
	})})
	return srv.Start(ctx)
}

// tolerations is kadmit's lifespan rule: no label tolerates every
// lifespan-remaining taint, label N tolerates the values N..maxDays.
func tolerations(labels map[string]string) ([]corev1.Toleration, error) {
	v, ok := labels[labelRequested]
	if !ok {
		return []corev1.Toleration{{Key: taintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > maxDays || strings.TrimLeft(v, "0123456789") != "" {
		return nil, fmt.Errorf("label %s must be an integer in [0, %d], got %q", labelRequested, maxDays, v)
	}
	var out []corev1.Toleration
	for i := n; i <= maxDays; i++ {
		out = append(out, corev1.Toleration{Key: taintKey, Operator: corev1.TolerationOpEqual, Value: strconv.Itoa(i), Effect: corev1.TaintEffectNoSchedule})
	}
	return out, nil
}

func hasToleration(have []corev1.Toleration, t corev1.Toleration) bool {
	for _, h := range have {
		op := h.Operator
		if op == "" {
			op = corev1.TolerationOpEqual
		}
		if h.Key == t.Key && op == t.Operator && h.Value == t.Value && h.Effect == t.Effect {
			return true
		}
	}
	return false
}

// serveBare is the floor: TLS, HTTP/1.1, read the body, decode the uid,
// answer allowed. Nothing a real webhook could skip.
func serveBare(ctx context.Context, port int, certDir string) error {
	cert, err := tls.LoadX509KeyPair(filepath.Join(certDir, "tls.crt"), filepath.Join(certDir, "tls.key"))
	if err != nil {
		return err
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 7<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var review struct {
			APIVersion string `json:"apiVersion"`
			Request    struct {
				UID string `json:"uid"`
			} `json:"request"`
		}
		if err := json.Unmarshal(body, &review); err != nil || review.Request.UID == "" {
			http.Error(w, "malformed AdmissionReview", http.StatusBadRequest)
			return
		}
		resp, _ := json.Marshal(map[string]any{
			"apiVersion": review.APIVersion, "kind": "AdmissionReview",
			"response": map[string]any{"uid": review.Request.UID, "allowed": true},
		})
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(resp)
	})
	srv := &http.Server{
		Addr:              net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Handler:           h,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}},
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.ListenAndServeTLS("", ""); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// writeCert writes a self-signed ECDSA P-256 certificate for 127.0.0.1,
// valid one day, to dir/tls.crt and dir/tls.key; the certificate is its own
// CA, so clients trust dir/tls.crt.
func writeCert(dir string) error {
	if dir == "" {
		return errors.New("certs: directory argument required")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "kadmit-bench-reference"},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
}
