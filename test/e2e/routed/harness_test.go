package routed

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kadmit/kadmit/test/controlplane/kadmitproc"
	"github.com/kadmit/kadmit/test/netns"
	"github.com/kadmit/kadmit/test/poll"
)

// ---------------------------------------------------------------------------
// Replicas and the endpoints controller.

// replica is one `kadmit serve` process: a pod, as far as the test goes.
type replica struct {
	name        string // the "pod" name, in the EndpointSlice
	ip          string // its own address on lo
	addr        string // ip:9443
	metricsAddr string // ip:8080
	proc        *kadmitproc.Process

	mu          sync.Mutex
	ready       bool   // last /readyz answer was 200
	readyz      string // last /readyz answer, for messages
	deleted     bool   // the "pod" is gone: no longer in the EndpointSlice
	everReady   bool
	publishedAt time.Time // when the EndpointSlice last listed it ready
}

func (r *replica) state() (ready bool, readyz string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ready, r.readyz
}

// sliceChange records one EndpointSlice write.
type sliceChange struct {
	at    time.Time
	ready []string // identities listed ready
}

// cluster plays kubelet and endpoints controller for kadmit's Service.
type cluster struct {
	e *env

	mu       sync.Mutex
	replicas []*replica
	next     int // index of the next replica's address
	// publish off keeps the EndpointSlice unwritten, as when no endpoints
	// controller has caught up yet (the bootstrap guard's test).
	publish atomic.Bool
	slice   *discoveryv1.EndpointSlice
	written string // fingerprint of the last endpoints written
	changes []sliceChange

	stop chan struct{}
	done chan struct{}
}

const sliceName = "kadmit-routed"

func newCluster(e *env) *cluster {
	c := &cluster{e: e, stop: make(chan struct{}), done: make(chan struct{})}
	c.publish.Store(true)
	return c
}

// selfManagedArgs is the command line of a production-like replica.
func (c *cluster) selfManagedArgs(name, addr, metricsAddr string) []string {
	return []string{"serve",
		"--tls=self-managed", "--register",
		"--namespace", systemNS, "--secret-name", secretName,
		"--service-name", serviceName, "--service-port", strconv.Itoa(servicePort),
		"--kubeconfig", c.e.Kubeconfig,
		"--addr", addr, "--metrics-addr", metricsAddr,
		"--shutdown-grace", "5s", "--log-format", "json",
	}
}

// startReplica starts a replica on the next free address; args builds its
// command line from its name and addresses (nil: selfManagedArgs).
func (c *cluster) startReplica(t *testing.T, args func(name, addr, metricsAddr string) []string) *replica {
	t.Helper()
	c.mu.Lock()
	i := c.next
	c.next++
	c.mu.Unlock()
	if i > 200 {
		t.Fatal("out of replica addresses")
	}
	r := &replica{name: fmt.Sprintf("replica-%d", i), ip: fmt.Sprintf("198.18.0.%d", 10+i)}
	r.addr, r.metricsAddr = net.JoinHostPort(r.ip, strconv.Itoa(targetPort)), net.JoinHostPort(r.ip, "8080")
	if err := netns.AddLoopbackAddr(r.ip); err != nil {
		t.Fatal(err)
	}
	if args == nil {
		args = c.selfManagedArgs
	}
	logFile, err := os.Create(filepath.Join(c.e.Tmp, r.name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	r.proc, err = kadmitproc.Start(kadmitproc.Options{Binary: c.e.Binary, Addr: r.addr, MetricsAddr: r.metricsAddr,
		Args: args(r.name, r.addr, r.metricsAddr), Log: logFile})
	if err != nil {
		t.Fatal(err)
	}
	go func() { <-r.proc.Exited(); _ = logFile.Close() }()
	c.mu.Lock()
	c.replicas = append(c.replicas, r)
	c.mu.Unlock()
	return r
}

// running reports whether the process has not ended.
func (r *replica) running() bool {
	select {
	case <-r.proc.Exited():
		return false
	default:
		return true
	}
}

// live returns the replicas whose pod exists (not deleted).
func (c *cluster) live() []*replica {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*replica
	for _, r := range c.replicas {
		r.mu.Lock()
		if !r.deleted {
			out = append(out, r)
		}
		r.mu.Unlock()
	}
	return out
}

func (c *cluster) byName(name string) *replica {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.replicas {
		if r.name == name {
			return r
		}
	}
	return nil
}

// remove deletes a replica's pod: it leaves the EndpointSlice at once, like
// a terminating pod, and is then sent SIGTERM once the slice says so.
func (c *cluster) remove(r *replica) error {
	r.mu.Lock()
	r.deleted = true
	r.mu.Unlock()
	// Let the endpoints controller write the slice without it and the API
	// server see that, as a preStop delay would, before the process stops
	// accepting connections.
	// Best effort: past 3s the replica stops anyway, as a kubelet would.
	_ = poll.Until(context.Background(), 3*time.Second, func(context.Context) error {
		if c.published(r.name) {
			return errors.New("still published")
		}
		return nil
	})
	if c.publish.Load() {
		time.Sleep(300 * time.Millisecond)
	}
	code, _, err := r.proc.Terminate(replicaStopGrace)
	if err == nil && code != 0 && code != -1 {
		err = fmt.Errorf("%s exited with code %d after SIGTERM", r.name, code)
	}
	return err
}

// published reports whether the last written slice lists name as ready.
func (c *cluster) published(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.changes) == 0 {
		return false
	}
	return slices.Contains(c.changes[len(c.changes)-1].ready, name)
}

// firstPublishedReady is when the slice first listed a ready endpoint after
// since, or the zero time.
func (c *cluster) firstPublishedReady(since time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.changes {
		if !ch.at.Before(since) && len(ch.ready) > 0 {
			return ch.at
		}
	}
	return time.Time{}
}

// unpublishedAt is when the slice first stopped listing name as ready after
// since, or the zero time.
func (c *cluster) unpublishedAt(name string, since time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.changes {
		if !ch.at.Before(since) && !slices.Contains(ch.ready, name) {
			return ch.at
		}
	}
	return time.Time{}
}

// startEndpointsController probes every replica's /readyz every 200ms and
// writes the EndpointSlice when the result changes, as the endpoints
// controller does from the kubelet's readiness probes.
func (c *cluster) startEndpointsController() {
	go func() {
		defer close(c.done)
		hc := &http.Client{Timeout: time.Second}
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-tick.C:
			}
			c.probe(hc)
			if c.publish.Load() {
				if err := c.writeSlice(); err != nil {
					fmt.Fprintf(os.Stderr, "routed: endpoints controller: %v\n", err)
				}
			}
		}
	}()
}

func (c *cluster) probe(hc *http.Client) {
	var wg sync.WaitGroup
	for _, r := range c.live() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, answer := false, ""
			resp, err := hc.Get("http://" + r.metricsAddr + "/readyz")
			if err != nil {
				answer = err.Error()
			} else {
				body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
				_ = resp.Body.Close()
				ok = resp.StatusCode == http.StatusOK
				answer = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
			}
			r.mu.Lock()
			r.ready, r.readyz = ok, answer
			r.everReady = r.everReady || ok
			r.mu.Unlock()
		}()
	}
	wg.Wait()
}

func (c *cluster) writeSlice() error {
	var eps []discoveryv1.Endpoint
	var ready []string
	var fp strings.Builder
	for _, r := range c.live() {
		ok, _ := r.state()
		eps = append(eps, discoveryv1.Endpoint{
			Addresses: []string{r.ip},
			Conditions: discoveryv1.EndpointConditions{
				Ready: ptr.To(ok), Serving: ptr.To(ok), Terminating: ptr.To(false),
			},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: systemNS, Name: r.name},
		})
		if ok {
			ready = append(ready, r.name)
		}
		fmt.Fprintf(&fp, "%s=%v;", r.ip, ok)
	}
	c.mu.Lock()
	unchanged := c.slice != nil && c.written == fp.String()
	c.mu.Unlock()
	if unchanged {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	api := c.e.Client.DiscoveryV1().EndpointSlices(systemNS)
	desired := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: sliceName, Namespace: systemNS, Labels: map[string]string{
			discoveryv1.LabelServiceName: serviceName,
			discoveryv1.LabelManagedBy:   "routed-e2e.kadmit.io",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(portName), Port: ptr.To[int32](targetPort), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	c.mu.Lock()
	cur := c.slice
	c.mu.Unlock()
	var got *discoveryv1.EndpointSlice
	var err error
	if cur == nil {
		got, err = api.Create(ctx, desired, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			if cur, err = api.Get(ctx, sliceName, metav1.GetOptions{}); err != nil {
				return err
			}
		}
	}
	if cur != nil {
		desired.ResourceVersion = cur.ResourceVersion
		got, err = api.Update(ctx, desired, metav1.UpdateOptions{})
	}
	if err != nil {
		// Conflict or a deleted slice: start over from the server next tick.
		c.mu.Lock()
		c.slice = nil
		c.mu.Unlock()
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return fmt.Errorf("write EndpointSlice: %w", err)
	}
	c.mu.Lock()
	c.slice, c.written = got, fp.String()
	c.changes = append(c.changes, sliceChange{at: time.Now(), ready: ready})
	c.mu.Unlock()
	for _, r := range c.live() {
		if slices.Contains(ready, r.name) {
			r.mu.Lock()
			r.publishedAt = time.Now()
			r.mu.Unlock()
		}
	}
	return nil
}

// deleteSlice removes the EndpointSlice (reset); the controller writes it
// afresh when publishing.
func (c *cluster) deleteSlice(ctx context.Context) error {
	err := c.e.Client.DiscoveryV1().EndpointSlices(systemNS).Delete(ctx, sliceName, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	c.mu.Lock()
	c.slice, c.written = nil, ""
	c.mu.Unlock()
	return nil
}

// stopAll SIGTERMs every live replica, in parallel, and waits for them.
func (c *cluster) stopAll() error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for _, r := range c.live() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.remove(r); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// Killed replicas are "deleted" too, but make sure none is left running.
	c.mu.Lock()
	all := append([]*replica(nil), c.replicas...)
	c.mu.Unlock()
	for _, r := range all {
		if r.proc.ExitCode() == -1 {
			select {
			case <-r.proc.Exited():
			default:
				if _, _, err := r.proc.Terminate(replicaStopGrace); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// shutdown ends the endpoints controller and every replica (teardown).
func (c *cluster) shutdown() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		fmt.Fprintln(os.Stderr, "routed: endpoints controller did not stop")
	}
	c.publish.Store(false)
	if err := c.stopAll(); err != nil {
		fmt.Fprintf(os.Stderr, "routed: stopping replicas: %v\n", err)
	}
}

func (c *cluster) dumpLogs(w io.Writer, n int) {
	c.mu.Lock()
	all := append([]*replica(nil), c.replicas...)
	c.mu.Unlock()
	for _, r := range all {
		fmt.Fprintf(w, "routed: %s's last log lines:\n%s\n", r.name, r.proc.Tail(n))
	}
}

// secretWrote is the log message of a replica's write of the certificate
// Secret (pkg/webhookcerts).
const secretWrote = `"msg":"wrote certificate Secret"`

// lastSecretWriter returns the live replica whose log shows the latest
// write of the certificate Secret, or when none does (they all started
// after it was written) the first live replica; nil when none is live.
// No replica is special any more (no Lease): this is the one a test kills
// to take the last writer away.
func (c *cluster) lastSecretWriter() *replica {
	live := c.live()
	var last *replica
	var lastAt time.Time
	for _, r := range live {
		for _, l := range r.proc.Logs() {
			if !strings.Contains(l, secretWrote) {
				continue
			}
			var line struct {
				Time time.Time `json:"time"`
			}
			if json.Unmarshal([]byte(l), &line) == nil && !line.Time.Before(lastAt) {
				last, lastAt = r, line.Time
			}
		}
	}
	if last == nil && len(live) > 0 {
		last = live[0]
	}
	return last
}

// secretWriters names the replicas whose log shows a write of the
// certificate Secret at or after since.
func (c *cluster) secretWriters(since time.Time) []string {
	var out []string
	for _, r := range c.live() {
		for _, l := range r.proc.Logs() {
			var line struct {
				Time time.Time `json:"time"`
			}
			if strings.Contains(l, secretWrote) && json.Unmarshal([]byte(l), &line) == nil && !line.Time.Before(since) {
				out = append(out, r.name)
				break
			}
		}
	}
	return out
}

// countLogs counts the log lines of rs containing s.
// countLogs counts the log lines of rs containing s and every one of also.
func countLogs(rs []*replica, s string, also ...string) int {
	n := 0
	for _, r := range rs {
		for _, l := range r.proc.Logs() {
			if strings.Contains(l, s) && !slices.ContainsFunc(also, func(a string) bool { return !strings.Contains(l, a) }) {
				n++
			}
		}
	}
	return n
}

// ---------------------------------------------------------------------------
// Load: dry-run pod creations at a fixed rate.

type result struct {
	start, end time.Time
	err        error
	mutated    bool // kadmit's lifespan webhook answered
}

type loadGen struct {
	stopc   chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	results []result
	bounded bool // the load stopped at its time or count bound, not at finish
}

// startLoad creates (server-side dry-run) rate pods per second in loadNS
// until finish is called, t ends or maxDur has elapsed, so never more than
// rate*maxDur requests; at most 100 are in flight.
func (e *env) startLoad(t *testing.T, rate int, maxDur time.Duration) *loadGen {
	l := &loadGen{stopc: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() { l.finish() })
	maxCount := int(maxDur.Seconds()*float64(rate)) + 1
	go func() {
		defer close(l.done)
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		deadline := time.NewTimer(maxDur)
		defer deadline.Stop()
		sem := make(chan struct{}, 100)
		var wg sync.WaitGroup
		defer wg.Wait()
		defer func() {
			select {
			case <-l.stopc:
			default:
				l.mu.Lock()
				l.bounded = true
				l.mu.Unlock()
			}
		}()
		for i := 0; i < maxCount; i++ {
			select {
			case <-l.stopc:
				return
			case <-deadline.C:
				return
			case <-tick.C:
			}
			select {
			case sem <- struct{}{}:
			default:
				// 100 in flight: the API server is stalled; count it.
				l.add(result{start: time.Now(), end: time.Now(), err: errors.New("load: 100 requests in flight")})
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				l.add(createPod(e.Client, loadNS, fmt.Sprintf("load-%d", i), nil))
			}()
		}
	}()
	return l
}

func (l *loadGen) add(r result) {
	l.mu.Lock()
	l.results = append(l.results, r)
	l.mu.Unlock()
}

// snapshot returns the results so far, ordered by start.
func (l *loadGen) snapshot() []result {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := append([]result(nil), l.results...)
	slices.SortFunc(out, func(a, b result) int { return a.start.Compare(b.start) })
	return out
}

// hitBound reports whether the load has stopped on its own, at its time or
// count bound: a test whose load must outlast some event fails on it.
func (l *loadGen) hitBound() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bounded
}

// finish stops the load, waits for in-flight requests and returns every
// result, ordered by start.
func (l *loadGen) finish() []result {
	select {
	case <-l.stopc:
	default:
		close(l.stopc)
	}
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	out := append([]result(nil), l.results...)
	slices.SortFunc(out, func(a, b result) int { return a.start.Compare(b.start) })
	return out
}

// createPod dry-runs the creation of a pod and reports how it went.
// A mirror pod (annotations kubernetes.io/config.mirror) needs a node.
func createPod(client kubernetes.Interface, ns, name string, annotations map[string]string) result {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}}},
	}
	if _, ok := annotations["kubernetes.io/config.mirror"]; ok {
		pod.Spec.NodeName = "node-1"
	}
	r := result{start: time.Now()}
	got, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	r.end, r.err = time.Now(), err
	if err == nil {
		r.mutated = slices.ContainsFunc(got.Spec.Tolerations, func(t corev1.Toleration) bool { return t.Key == "acme.com/lifespan-remaining" })
	}
	return r
}

// summary describes results: counts, and each failure (up to 10).
type summary struct {
	total, failed, mutated int
	firstFail, lastFail    time.Time // start of the first, end of the last failure
	messages               []string
}

func summarize(rs []result) summary {
	var s summary
	for _, r := range rs {
		s.total++
		if r.mutated {
			s.mutated++
		}
		if r.err == nil {
			continue
		}
		s.failed++
		if s.firstFail.IsZero() {
			s.firstFail = r.start
		}
		if r.end.After(s.lastFail) {
			s.lastFail = r.end
		}
		if len(s.messages) < 10 {
			s.messages = append(s.messages, r.start.Format("15:04:05.000")+" "+r.err.Error())
		}
	}
	return s
}

func (s summary) String() string {
	out := fmt.Sprintf("%d admissions, %d failed, %d mutated by kadmit", s.total, s.failed, s.mutated)
	for _, m := range s.messages {
		out += "\n  " + m
	}
	return out
}

// ---------------------------------------------------------------------------
// Certificates.

// servedLeaf handshakes with addr as the API server does (ServerName
// kadmit.kadmit-system.svc) and returns the certificate served.
func servedLeaf(addr string) (*x509.Certificate, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second},
		Config: &tls.Config{ServerName: serverName, InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}} //nolint:gosec // verified by the caller
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	pcs := conn.(*tls.Conn).ConnectionState().PeerCertificates
	if len(pcs) == 0 {
		return nil, errors.New("no certificate served")
	}
	return pcs[0], nil
}

// verifyAgainst checks leaf for serverName against exactly the CAs given.
func verifyAgainst(leaf *x509.Certificate, cas ...*x509.Certificate) error {
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: serverName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err
}

// secretMaterial returns the certificate Secret's CAs and serving leaf.
func (e *env) secretMaterial(ctx context.Context) (cas []*x509.Certificate, leaf *x509.Certificate, s *corev1.Secret, err error) {
	s, err = e.Client.CoreV1().Secrets(systemNS).Get(ctx, secretName, metav1.GetOptions{})
	if err != nil {
		return nil, nil, nil, err
	}
	if cas, err = webhookcerts.ParseCertificates(s.Data["ca.crt"]); err != nil {
		return nil, nil, s, fmt.Errorf("ca.crt: %w", err)
	}
	ls, err := webhookcerts.ParseCertificates(s.Data["tls.crt"])
	if err != nil {
		return nil, nil, s, fmt.Errorf("tls.crt: %w", err)
	}
	return cas, ls[0], s, nil
}

// ---------------------------------------------------------------------------
// Waiting.

// eventually polls cond (test/poll) until it returns nil or d elapses; it
// returns how long it took, or fails t with cond's last error.
func eventually(t *testing.T, d time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	if err := poll.Until(t.Context(), d, func(context.Context) error { return cond() }); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return time.Since(start)
}

// rotateServing asks the replicas for a serving-certificate rotation (the
// kadmit.io/rotate annotation) and waits, at most 30 s, until the Secret holds
// a leaf other than origLeaf, the annotation is consumed and every replica
// serves the new leaf, verified against the Secret's CAs; it returns how long
// that took and fails t otherwise (what names the wait).
func (e *env) rotateServing(ctx context.Context, t *testing.T, what string, origLeaf *x509.Certificate) time.Duration {
	t.Helper()
	if err := e.annotateRotate(ctx, "serving"); err != nil {
		t.Fatal(err)
	}
	return eventually(t, 30*time.Second, what, func() error {
		cas, leaf, s, err := e.secretMaterial(ctx)
		if err != nil {
			return err
		}
		if _, ok := s.Annotations["kadmit.io/rotate"]; ok || leaf.Equal(origLeaf) {
			return errors.New("not rotated yet")
		}
		return e.everyReplicaServes(func(l *x509.Certificate) error {
			if !l.Equal(leaf) {
				return errors.New("not the Secret's new certificate")
			}
			return verifyAgainst(l, cas...)
		})
	})
}
