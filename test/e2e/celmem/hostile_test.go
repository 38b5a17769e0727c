// Package celmem reproduces issue 20's point 1 against a real `kadmit serve
// --policies` process: reviews sent straight to the webhook port (open to
// every pod with the chart's defaults) whose objects the declared policies
// decode. kadmit runs with the chart's GOMEMLIMIT=200MiB; each attack must
// leave its peak RSS (VmHWM) under 224 MiB (see rssLimit), the process
// alive and /validate-pod answering. `serve --policies` follows the cluster's
// namespaces (namespaceSelector), so a real kube-apiserver and etcd run
// too (KADMIT_CONTROLPLANE_DIR); the attacks never go through them.
//
// KADMIT_HOSTILE_BINARY runs the same attacks against another kadmit
// binary (e.g. one built from the commit before the decode budget) to
// measure it; it then fails on what it measures.
//
// Run: cd test && KADMIT_E2E_REQUIRED=1 KADMIT_CONTROLPLANE_DIR=... go test -count=1 -v ./e2e/celmem/
package celmem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kadmit/kadmit/test/controlplane"
	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/procstat"
)

const mib = 1 << 20

// rssLimit bounds peak RSS: the chart's GOMEMLIMIT (200 MiB) is a soft
// target the garbage collector works toward, counted in the runtime's own
// memory, so RSS may pass it by a little; 224 MiB keeps 32 MiB under the
// chart's 256 MiB container limit.
const rssLimit = 224 * mib

var world struct {
	cp   *controlplane.ControlPlane
	bin  string
	tmp  string
	skip string
}

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	required := os.Getenv("KADMIT_E2E_REQUIRED") == "1"
	dir, err := controlplane.FindBinaries("")
	if err != nil {
		if required || !errors.Is(err, controlplane.ErrBinariesMissing) {
			fmt.Fprintln(os.Stderr, "celmem:", err)
			return 1
		}
		world.skip = err.Error()
		return m.Run()
	}
	if world.tmp, err = os.MkdirTemp("", "kadmit-celmem-"); err != nil {
		fmt.Fprintln(os.Stderr, "celmem:", err)
		return 1
	}
	defer os.RemoveAll(world.tmp)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	world.bin = os.Getenv("KADMIT_HOSTILE_BINARY")
	if world.bin == "" {
		root, err := kadmitproc.RepoRoot()
		if err != nil {
			fmt.Fprintln(os.Stderr, "celmem:", err)
			return 1
		}
		world.bin = filepath.Join(world.tmp, "kadmit")
		if err := kadmitproc.Build(ctx, root, world.bin); err != nil {
			fmt.Fprintln(os.Stderr, "celmem:", err)
			return 1
		}
	}
	cp, err := controlplane.Start(ctx, controlplane.Options{Dir: dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, "celmem:", err)
		return 1
	}
	defer func() { _ = cp.Stop() }()
	world.cp = cp
	return m.Run()
}

// The policies of the reproduction: one VAP reading object.spec
// of a free-form custom resource, five trivial MAPs on pods.
const vap = `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: reads-spec}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: ["example.com"], apiVersions: ["v1"], operations: ["CREATE", "UPDATE"], resources: ["blobs"]}]
  validations:
  - expression: "!has(object.spec.forbidden)"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: reads-spec}
spec: {policyName: reads-spec, validationActions: [Deny]}
`

func mapPolicy(i int) string {
	return fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: label-%[1]d}
spec:
  reinvocationPolicy: Never
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["pods"]}]
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: "Object{metadata: Object.metadata{labels: {'m%[1]d': 'x'}}}"
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: label-%[1]d}
spec: {policyName: label-%[1]d}
`, i)
}

type proc struct {
	t       *testing.T
	p       *kadmitproc.Process
	addr    string
	metrics string
	client  *http.Client
}

// start runs `kadmit serve --policies` (not registered: the attacks are
// sent straight to its port) with GOMEMLIMIT=200MiB.
func start(t *testing.T) *proc {
	docs := vap
	for i := 1; i <= 5; i++ {
		docs += "---\n" + mapPolicy(i)
	}
	return startWith(t, docs)
}

// startWith is start with the policy documents docs.
func startWith(t *testing.T, docs string) *proc {
	t.Helper()
	if world.skip != "" {
		t.Skip(world.skip)
	}
	tmp := t.TempDir()
	pol := filepath.Join(tmp, "policies")
	if err := os.Mkdir(pol, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pol, "policies.yaml"), []byte(docs), 0o600); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(tmp, "kubeconfig")
	if err := world.cp.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	addr, metricsAddr, err := kadmitproc.FreeAddrs()
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(tmp, "ca.crt")
	t.Setenv("GOMEMLIMIT", "200MiB") // read by the child only: the runtime reads it at start
	p, err := kadmitproc.Start(kadmitproc.Options{Binary: world.bin, Addr: addr, MetricsAddr: metricsAddr, Args: []string{
		"serve", "--self-signed", "--dns-name", "127.0.0.1", "--ca-file", caFile,
		"--addr", addr, "--metrics-addr", metricsAddr, "--log-format", "json",
		"--kubeconfig", kubeconfig, "--policies", pol,
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kadmit log:\n%s", p.Tail(20))
		}
		_ = p.Kill()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	client, err := kadmitproc.HTTPSClient(caFile, 16)
	if err != nil {
		t.Fatal(err)
	}
	return &proc{t: t, p: p, addr: addr, metrics: metricsAddr, client: client}
}

// status reads one kB field of /proc/<pid>/status, in bytes: VmHWM is
// the peak RSS.
func (p *proc) status(field string) int64 {
	v, err := procstat.Status(p.p.PID(), field)
	if err != nil {
		p.t.Fatalf("kadmit: %v", err)
	}
	return v
}

// cpu is the process's user+system CPU time.
func (p *proc) cpu() time.Duration {
	d, err := procstat.CPU(p.p.PID())
	if err != nil {
		p.t.Fatalf("kadmit: %v", err)
	}
	return d
}

func (p *proc) post(path string, body []byte) (int, string) {
	req, _ := http.NewRequest(http.MethodPost, "https://"+p.addr+path+"?timeout=10s", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}

// healthy asserts the process runs and /validate-pod answers a pod 200.
func (p *proc) healthy() {
	p.t.Helper()
	select {
	case <-p.p.Exited():
		p.t.Fatalf("kadmit exited with %d", p.p.ExitCode())
	default:
	}
	if code, body := p.post("/validate-pod", review("pods", "", "Pod", []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"ok","namespace":"default"},"spec":{"containers":[{"name":"c","image":"nginx"}]}}`))); code != 200 || !strings.Contains(body, `"allowed":true`) {
		p.t.Fatalf("/validate-pod after the attack: %d %s", code, body)
	}
}

func review(resource, group, kind string, obj []byte) []byte {
	return []byte(fmt.Sprintf(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u",
"kind":{"group":%[1]q,"version":"v1","kind":%[2]q},"resource":{"group":%[1]q,"version":"v1","resource":%[3]q},
"namespace":"default","name":"x","operation":"CREATE","userInfo":{"username":"u"},"object":%[4]s}}`, group, kind, resource, obj))
}

// blob is a free-form custom resource of about n bytes whose spec is the
// costliest shape to decode ({"a":1} objects: 44x held decoded).
func blob(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"apiVersion":"example.com/v1","kind":"Blob","metadata":{"name":"x","namespace":"default"},"spec":{"items":[`)
	for i := 0; b.Len() < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"a":1}`)
	}
	b.WriteString("]}}")
	return []byte(b.String())
}

// bigPod is a pod of about n bytes: one container with many environment
// variables, what a user who may create pods can send.
func bigPod(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x","namespace":"default"},"spec":{"containers":[{"name":"c","image":"nginx","env":[`)
	for i := 0; b.Len() < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"E%d","value":"v"}`, i)
	}
	b.WriteString("]}]}}")
	return []byte(b.String())
}

// bigPodValues is bigPod with environment values of valueLen bytes.
func bigPodValues(n, valueLen int) []byte {
	value := strings.Repeat("v", valueLen)
	var b strings.Builder
	b.WriteString(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x","namespace":"default"},"spec":{"containers":[{"name":"c","image":"nginx","env":[`)
	for i := 0; b.Len() < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"E%d","value":%q}`, i, value)
	}
	b.WriteString("]}]}}")
	return []byte(b.String())
}

func blobReview(n int) []byte { return review("blobs", "example.com", "Blob", blob(n)) }

// finish waits for the process to settle, then asserts the bounds.
func (p *proc) finish(what string, base int64, start time.Time, cpu0 time.Duration, codes map[int]int) {
	p.t.Helper()
	time.Sleep(time.Second)
	peak := p.status("VmHWM")
	p.t.Logf("%s: RSS %d MiB before, peak %d MiB; %v wall, %v CPU; answers by HTTP status %v",
		what, base/mib, peak/mib, time.Since(start).Round(10*time.Millisecond), p.cpu()-cpu0, codes)
	p.healthy()
	if peak > rssLimit {
		p.t.Fatalf("%s: peak RSS %d MiB above %d MiB", what, peak/mib, rssLimit/mib)
	}
}

// parallel sends n copies of body to path at once, returning the counts
// of HTTP statuses (0: no answer).
func (p *proc) parallel(n int, path string, body []byte) map[int]int {
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			code, _ := p.post(path, body)
			mu.Lock()
			codes[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return codes
}

// (a) One 7 MiB review: the largest body kadmit accepts.
func TestHostileOneLargeReview(t *testing.T) {
	p := start(t)
	base, cpu0, t0 := p.status("VmRSS"), p.cpu(), time.Now()
	body := blobReview(7<<20 - 1024)
	code, msg := p.post("/validate-policies", body)
	p.finish("one 7 MiB review", base, t0, cpu0, map[int]int{code: 1})
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "--policy-max-object-bytes") {
		t.Fatalf("answer %d %s, want 413 naming the size bound", code, msg)
	}
}

// (b) Eight 3 MB reviews at once.
func TestHostileParallelReviews(t *testing.T) {
	p := start(t)
	base, cpu0, t0 := p.status("VmRSS"), p.cpu(), time.Now()
	codes := p.parallel(8, "/validate-policies", blobReview(3_000_000))
	p.finish("8 parallel 3 MB reviews", base, t0, cpu0, codes)
	if codes[http.StatusRequestEntityTooLarge] != 8 {
		t.Fatalf("answers %v, want 8 x 413", codes)
	}
}

// (c) A 3 MB pod to the five MAPs.
func TestHostileLargePodToMutatingPolicies(t *testing.T) {
	p := start(t)
	base, cpu0, t0 := p.status("VmRSS"), p.cpu(), time.Now()
	code, msg := p.post("/mutate-policies", review("pods", "", "Pod", bigPod(3_000_000)))
	p.finish("3 MB pod to 5 MAPs", base, t0, cpu0, map[int]int{code: 1})
	if code != http.StatusRequestEntityTooLarge {
		t.Fatalf("answer %d %s, want 413", code, msg)
	}
	if took := time.Since(t0); took > 5*time.Second {
		t.Fatalf("answered after %v", took)
	}
}

// (c2) A pod just under the size cap (1.4 MB) to the five MAPs: they run
// on one decoded copy of it, encoded and diffed once (celpolicy
// serveMutateGroup), so it is answered, patched, well within its 10 s
// deadline and with bounded memory. The same size of the densest pod
// (one-letter environment values, an estimated 105 MB of decoding and
// patching) is more than the whole decode budget: refused 413 at once.
func TestHostilePodUnderCapToMutatingPolicies(t *testing.T) {
	p := start(t)
	base, cpu0, t0 := p.status("VmRSS"), p.cpu(), time.Now()
	pod := bigPodValues(1_400_000, 100)
	code, msg := p.post("/mutate-policies", review("pods", "", "Pod", pod))
	took := time.Since(t0)
	p.finish(fmt.Sprintf("%d-byte pod (100-byte env values) to 5 MAPs", len(pod)), base, t0, cpu0, map[int]int{code: 1})
	if code != http.StatusOK || !strings.Contains(msg, `"allowed":true`) || !strings.Contains(msg, `"patch":`) {
		t.Fatalf("answer %d %.300s, want 200 allowed with a patch", code, msg)
	}
	if took > 8*time.Second {
		t.Fatalf("answered after %v: past what its 10 s deadline leaves", took)
	}

	base, cpu0, t0 = p.status("VmRSS"), p.cpu(), time.Now()
	code, msg = p.post("/mutate-policies", review("pods", "", "Pod", bigPod(1_400_000)))
	p.finish("1.4 MB pod (one-letter env values) to 5 MAPs", base, t0, cpu0, map[int]int{code: 1})
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "budget") {
		t.Fatalf("answer %d %.300s, want 413 naming the decode budget", code, msg)
	}
	if took := time.Since(t0); took > 5*time.Second {
		t.Fatalf("refused after %v", took)
	}
}

// (d) Objects under the size bound, 8 clients for 8 s, half of them to
// the VAP (1 MB of the costliest shape, an estimated 49 MB decoded), half
// 500 KB pods to the five MAPs: only the decode budget bounds this.
func TestHostileDecodeBudgetUnderLoad(t *testing.T) {
	p := start(t)
	base, cpu0, t0 := p.status("VmRSS"), p.cpu(), time.Now()
	blobBody := blobReview(1_000_000)
	podBody := review("pods", "", "Pod", bigPod(500_000))
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			path, body := "/validate-policies", blobBody
			if i%2 == 1 {
				path, body = "/mutate-policies", podBody
			}
			for ctx.Err() == nil {
				code, _ := p.post(path, body)
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	p.finish("8 clients, 1 MB blobs to the VAP and 500 KB pods to the MAPs, 8 s", base, t0, cpu0, codes)
	if codes[200] == 0 {
		t.Fatalf("no review answered 200: %v", codes)
	}
	if os.Getenv("KADMIT_HOSTILE_BINARY") == "" {
		resp, err := http.Get("http://" + p.metrics + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		m := string(b)
		if !strings.Contains(m, "kadmit_policy_decoded_bytes_limit 6.7108864e+07") || !strings.Contains(m, "\nkadmit_policy_decoded_bytes 0\n") ||
			strings.Contains(m, "kadmit_policy_decode_refused_total 0\n") || !strings.Contains(m, "kadmit_policy_decode_refused_total ") {
			t.Errorf("decode budget metrics after the load (budget given back, refusals counted):\n%s", grepLines(m, "kadmit_policy_decode"))
		}
	}
	// 500: a review past its deadline (CPU, on a shared machine); never a
	// dropped connection (0) or another status.
	for c := range codes {
		if c != 200 && c != http.StatusServiceUnavailable && c != http.StatusInternalServerError {
			t.Errorf("answers %v: only 200, 503 and 500 expected", codes)
		}
	}
}

func grepLines(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Point 8: 1,000 trivial validating policies on pods (the loader's bound,
// 2,000 documents with their bindings): kadmit's idle RSS, and the CPU of
// reviews matching all of them. Reported; the bound asserted is the RSS.
func TestThousandTrivialPolicies(t *testing.T) {
	var b strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&b, `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: p%[1]d}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["pods"]}]
  validations:
  - expression: "object.metadata.name != 'forbidden-%[1]d'"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: p%[1]d}
spec: {policyName: p%[1]d, validationActions: [Deny]}
---
`, i)
	}
	t0 := time.Now()
	p := startWith(t, b.String())
	ready := time.Since(t0)
	time.Sleep(2 * time.Second)
	idle := p.status("VmRSS")
	cpu0 := p.cpu()
	body := review("pods", "", "Pod", []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"ok","namespace":"default"},"spec":{"containers":[{"name":"c","image":"nginx"}]}}`))
	const n = 20
	for range n {
		if code, msg := p.post("/validate-policies", body); code != 200 || !strings.Contains(msg, `"allowed":true`) {
			t.Fatalf("review: %d %s", code, msg)
		}
	}
	perReview := (p.cpu() - cpu0) / n
	t.Logf("1,000 trivial VAPs: ready after %v (start CPU %v), idle RSS %d MiB, %v CPU per review matching all of them", ready.Round(100*time.Millisecond), cpu0, idle/mib, perReview)
	if idle > 160*mib {
		t.Fatalf("idle RSS %d MiB with 1,000 trivial policies, above 160 MiB", idle/mib)
	}
}
