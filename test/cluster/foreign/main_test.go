package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func review(t *testing.T, uid string, kind metav1.GroupVersionKind, op admissionv1.Operation, obj any) []byte {
	t.Helper()
	var raw runtime.RawExtension
	if obj != nil {
		b, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		raw.Raw = b
	}
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID(uid), Kind: kind, Operation: op, Namespace: "ns", Name: "p", Object: raw,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var podKind = metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}

func post(t *testing.T, c *http.Client, url string, body []byte) (int, *admissionv1.AdmissionReview) {
	t.Helper()
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("response %s: %v", b, err)
	}
	return resp.StatusCode, &out
}

// applyPatch applies the JSON Patch ops this webhook emits ("add" only)
// to obj, enough to check the patch does what the API server would do.
func applyPatch(t *testing.T, obj map[string]any, patch []byte) {
	t.Helper()
	var ops []jsonPatchOp
	if err := json.Unmarshal(patch, &ops); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		if op.Op != "add" {
			t.Fatalf("op %s", op.Op)
		}
		tokens := strings.Split(strings.TrimPrefix(op.Path, "/"), "/")
		cur := obj
		for i, tok := range tokens {
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			if i == len(tokens)-1 {
				cur[tok] = op.Value
				break
			}
			next, ok := cur[tok].(map[string]any)
			if !ok {
				t.Fatalf("patch path %s: parent %s missing (the API server would reject the patch)", op.Path, tok)
			}
			cur = next
		}
	}
}

func TestWebhook(t *testing.T) {
	var logs syncBuffer
	srv := httptest.NewTLSServer(&webhook{name: "kueue", log: log.New(&logs, "", 0)})
	defer srv.Close()
	c := srv.Client()

	for _, tc := range []struct {
		what        string
		annotations map[string]string
	}{
		{"no annotations", nil},
		{"empty annotations", map[string]string{}},
		{"other annotations", map[string]string{"a": "b", AnnotationServedBy: "old"}},
	} {
		pod := &corev1.Pod{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: tc.annotations},
		}
		code, out := post(t, c, srv.URL+"/mutate--v1-pod", review(t, "u-"+tc.what, podKind, admissionv1.Create, pod))
		if code != http.StatusOK {
			t.Fatalf("%s: status %d", tc.what, code)
		}
		r := out.Response
		if out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" || r == nil ||
			string(r.UID) != "u-"+tc.what || !r.Allowed || r.PatchType == nil || *r.PatchType != admissionv1.PatchTypeJSONPatch {
			t.Fatalf("%s: response %+v", tc.what, out)
		}
		b, _ := json.Marshal(pod)
		var obj map[string]any
		json.Unmarshal(b, &obj)
		applyPatch(t, obj, r.Patch)
		ann := obj["metadata"].(map[string]any)["annotations"].(map[string]any)
		if ann[AnnotationServedBy] != "kueue" {
			t.Errorf("%s: after patch %s annotations %v", tc.what, r.Patch, ann)
		}
		if tc.annotations["a"] == "b" && ann["a"] != "b" {
			t.Errorf("%s: patch %s lost an annotation", tc.what, r.Patch)
		}
	}

	// Allowed with no patch: a validating path, a non-pod, a DELETE.
	cm := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "c"}}
	for _, tc := range []struct {
		path string
		body []byte
	}{
		{"/validate--v1-pod", review(t, "v", podKind, admissionv1.Create, &corev1.Pod{})},
		{"/mutate", review(t, "cm", metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, admissionv1.Create, cm)},
		{"/mutate", review(t, "del", podKind, admissionv1.Delete, nil)},
		{"/", review(t, "apps", metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Pod"}, admissionv1.Create, cm)},
	} {
		code, out := post(t, c, srv.URL+tc.path, tc.body)
		if code != http.StatusOK || out.Response == nil || !out.Response.Allowed || out.Response.Patch != nil || out.Response.PatchType != nil {
			t.Errorf("%s: %d %+v", tc.path, code, out)
		}
	}

	// Malformed, wrong version, too large, wrong method.
	if code, _ := post(t, c, srv.URL+"/x", []byte("{")); code != http.StatusBadRequest {
		t.Errorf("bad JSON: %d", code)
	}
	if code, _ := post(t, c, srv.URL+"/x", []byte(`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}`)); code != http.StatusBadRequest {
		t.Errorf("v1beta1: %d", code)
	}
	big := append([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"`), bytes.Repeat([]byte("x"), maxBody)...)
	if code, _ := post(t, c, srv.URL+"/x", append(big, `"}}`...)); code != http.StatusRequestEntityTooLarge {
		t.Errorf("over 3 MiB: %d", code)
	}
	if resp, err := c.Get(srv.URL + "/x"); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %v %v", resp, err)
	}

	if l := logs.String(); !strings.Contains(l, "POST /mutate--v1-pod uid=u-no annotations CREATE ns/p patched=true") ||
		!strings.Contains(l, "POST /validate--v1-pod uid=v CREATE ns/p patched=false") {
		t.Errorf("log lines:\n%s", l)
	}
}

func TestEscapePointer(t *testing.T) {
	for in, want := range map[string]string{"a/b": "a~1b", "a~b": "a~0b", "~1": "~01", "x": "x"} {
		if got := escapePointer(in); got != want {
			t.Errorf("escapePointer(%q) = %q, want %q", in, got, want)
		}
	}
}

// writeCert writes a self-signed serving certificate for 127.0.0.1 with
// the given serial to dir/tls.crt and dir/tls.key, replacing both files
// atomically as a Secret volume update does.
func writeCert(t *testing.T, dir string, serial int64) *x509.CertPool {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "foreign"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"tls.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}),
	} {
		tmp := filepath.Join(dir, "."+name)
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return pool
}

// TestRun starts the whole program on loopback: /readyz and the webhook
// port wait for --not-ready-for, then the webhook serves over TLS, and a
// rotated certificate is served without a restart.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	pool1 := writeCert(t, dir, 1)
	addrs := make(chan [2]string, 2)
	ctx, cancel := context.WithCancel(context.Background())
	var logs syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, config{
			certDir: dir, addr: "127.0.0.1:0", healthAddr: "127.0.0.1:0", name: "lws",
			notReadyFor: 700 * time.Millisecond,
			onListen:    func(w string, a net.Addr) { addrs <- [2]string{w, a.String()} },
		}, log.New(&logs, "", 0))
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()

	h := <-addrs
	if h[0] != "health" {
		t.Fatalf("first listener %v", h)
	}
	start := time.Now()
	get := func(p string) int {
		resp, err := http.Get("http://" + h[1] + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := get("/healthz"); c != http.StatusOK {
		t.Errorf("/healthz %d", c)
	}
	if c := get("/readyz"); c != http.StatusServiceUnavailable {
		t.Errorf("/readyz before --not-ready-for elapsed: %d", c)
	}
	var w [2]string
	select {
	case w = <-addrs:
	case <-time.After(5 * time.Second):
		t.Fatal("webhook never listened")
	}
	if el := time.Since(start); el < 500*time.Millisecond {
		t.Errorf("webhook listened after %s, before --not-ready-for", el)
	}
	if c := get("/readyz"); c != http.StatusOK {
		t.Errorf("/readyz once listening: %d", c)
	}

	call := func(pool *x509.CertPool) (*x509.Certificate, error) {
		// A fresh transport per call: a new handshake each time.
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		resp, err := c.Post("https://"+w[1]+"/mutate", "application/json",
			bytes.NewReader(review(t, "r", podKind, admissionv1.Create, &corev1.Pod{})))
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("status %d", resp.StatusCode)
		}
		return resp.TLS.PeerCertificates[0], nil
	}
	cert, err := call(pool1)
	if err != nil || cert.SerialNumber.Int64() != 1 {
		t.Fatalf("first call: %v %v", cert, err)
	}
	pool2 := writeCert(t, dir, 2)
	cert, err = call(pool2)
	if err != nil || cert.SerialNumber.Int64() != 2 {
		t.Fatalf("after rotation: %v %v", cert, err)
	}
	if !strings.Contains(logs.String(), "POST /mutate uid=r") {
		t.Errorf("logs:\n%s", logs.String())
	}
}
