package doctor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// DialFunc opens a TCP connection, like net.Dialer.DialContext.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// ErrDialNotAllowed is what a restricted DialFunc returns for addresses it
// refuses; doctor reports such endpoints as unreachable (KD410), not broken.
var ErrDialNotAllowed = errors.New("dialing this address is not allowed")

// ErrHandshakePending is what an Options.Handshake seam returns for an
// endpoint it has no handshake result for yet: the endpoint gets no
// finding in this report (neither broken nor unreachable). kadmit watch
// returns it until its own handshake of a new endpoint completes.
var ErrHandshakePending = errors.New("handshake not made yet")

// HandshakeFunc returns the certificate chain endpoint addr ("ip:port" or
// "host:port") presented for serverName, on behalf of webhook w, or the
// dial/handshake error (errors wrapping syscall.ECONNREFUSED, timeouts and
// ErrDialNotAllowed are classified as doctor's own handshake does).
type HandshakeFunc func(ctx context.Context, w *Webhook, addr, serverName string) ([]*x509.Certificate, error)

// ErrNotFound is wrapped when a configuration named on the command line
// exists in neither kind.
var ErrNotFound = errors.New("webhook configuration not found")

// Options configure Run. The zero value checks every configuration without
// probing.
type Options struct {
	// Names restricts the report to the configurations with these names
	// (mutating or validating). All configurations are still read, since
	// cycles between webhooks involve the others.
	Names []string
	// Probe turns on the live probe (check 7): server-side dry-run creates.
	Probe bool
	// ProbeCount is how many probes per webhook (default 1); intermittent
	// failures, such as a Service routing to two workloads, need several.
	ProbeCount int
	// HandshakeTimeout bounds the TCP connect plus TLS handshake to one
	// endpoint; default 3s.
	HandshakeTimeout time.Duration
	// MaxEndpoints bounds the endpoints handshaken per webhook; default 10.
	MaxEndpoints int
	// MaxHandshakes bounds the distinct endpoints ("addr|serverName") doctor
	// dials in one run, whatever the number of webhooks; default
	// DefaultMaxHandshakes. The endpoints past it get a KD003 finding
	// instead of a handshake. Not used with Handshake (its caller bounds
	// its own).
	MaxHandshakes int
	// Concurrency is how many webhooks are checked at once (their
	// handshakes and probes in parallel); default 1. Run uses
	// DefaultConcurrency. A Handshake seam must be safe for concurrent use
	// when it is above 1.
	Concurrency int
	// ExpiryWarning: a serving certificate closer than this to expiry (and in
	// the last third of its life) is a warning; default DefaultExpiryWarning.
	ExpiryWarning time.Duration
	// Dial opens endpoint connections; default a net.Dialer. Tests restrict
	// it to their own addresses.
	Dial DialFunc
	// Now is the clock for certificate checks; default time.Now.
	Now func() time.Time
	// Webhooks restricts the report further to these webhooks, each as
	// "<configuration>/<webhook name>".
	Webhooks []string
	// Handshake, when set, replaces doctor's own dial and TLS handshake
	// (and its per-run cache): a long-running controller supplies results
	// of handshakes it makes on its own schedule. It may return
	// ErrHandshakePending.
	Handshake HandshakeFunc
	// InCluster says doctor runs on the cluster's pod network (kadmit
	// watch): a Service endpoint that times out or has no route is then a
	// finding (KD409, error) instead of "not reachable from here" (KD410,
	// info). URL webhooks keep KD410: the API server's host may reach what
	// a pod cannot.
	InCluster bool
	// FromError is an API server error message (at most MaxErrorMessage
	// bytes): the report is restricted to the webhook (or admission
	// policy) it names, leads with a KD002 finding saying which finding
	// explains it, and carries the parse in Report.FromError.
	FromError string
}

// Defaults of Run's bounds on what it dials and how much at once.
const (
	DefaultMaxHandshakes = 1000
	DefaultConcurrency   = 16
	// MaxConcurrency caps Options.Concurrency.
	MaxConcurrency = 64
)

func (o *Options) defaults() {
	if o.ProbeCount <= 0 {
		o.ProbeCount = 1
	}
	if o.MaxHandshakes <= 0 {
		o.MaxHandshakes = DefaultMaxHandshakes
	}
	o.Concurrency = min(max(o.Concurrency, 1), MaxConcurrency)
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 3 * time.Second
	}
	if o.MaxEndpoints <= 0 {
		o.MaxEndpoints = 10
	}
	if o.ExpiryWarning <= 0 {
		o.ExpiryWarning = DefaultExpiryWarning
	}
	if o.Dial == nil {
		var d net.Dialer
		o.Dial = d.DialContext
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// run holds the state of one Run.
type run struct {
	cs         kubernetes.Interface
	o          Options
	snap       *Snapshot
	all        []*Webhook
	namespaces map[string]map[string]string // name -> labels
	backends   map[string]*Backend          // "ns/name" -> backend
	// mu guards handshakes, probeCalls and objects: webhooks are checked
	// Concurrency at a time.
	mu sync.Mutex
	// handshakes caches per "addr|serverName" the result, since the
	// webhooks of one configuration usually share Service and caBundle;
	// at most MaxHandshakes entries.
	handshakes map[string]*handshakeResult
	// probeCalls records each probe's outcome and round trip (ProbeWebhook).
	probeCalls []ProbeCall
	// objects memoizes Backend.objects: every webhook is checked against
	// every backend's objects, which are the same for the whole run.
	objects map[*Backend][]Object
	// budget is KD608's per-run index over all webhooks (timeoutBudget),
	// computed once, by the first webhook checked, under budgetOnce.
	budgetOnce sync.Once
	budget     *budgetIndex
}

// newRun is a run over snap with opts (defaults already applied).
func newRun(cs kubernetes.Interface, snap *Snapshot, opts Options) *run {
	return &run{cs: cs, o: opts, snap: snap, all: snap.Webhooks, backends: snap.Backends, namespaces: snap.Namespaces, handshakes: map[string]*handshakeResult{}}
}

// objectsOf returns b.objects(), computed once per run.
func (r *run) objectsOf(b *Backend) []Object {
	r.mu.Lock()
	defer r.mu.Unlock()
	if o, ok := r.objects[b]; ok {
		return o
	}
	if r.objects == nil {
		r.objects = map[*Backend][]Object{}
	}
	o := b.objects()
	r.objects[b] = o
	return o
}

// handshakeResult is one endpoint's handshake; done is closed once chain
// and err are set (other webhooks wanting the same endpoint wait for it).
type handshakeResult struct {
	done  chan struct{}
	chain []*x509.Certificate
	err   error
}

// errHandshakeBound is the result of an endpoint past MaxHandshakes.
var errHandshakeBound = errors.New("the run's handshake bound was reached")

// ErrIncomplete is wrapped by Diagnose's error when ctx ended before every
// webhook was checked; the partial Report comes with it.
var ErrIncomplete = errors.New("doctor: report incomplete")

// Run reads a Snapshot of the cluster (LoadSnapshot) and diagnoses it
// (Diagnose). ctx bounds the whole run, API calls, handshakes and probes.
//
// Errors (doctor could not run; exit status 2): listing configurations
// failed, another read failed with something other than 403 Forbidden (a
// refused read is an AccessGap in the report, not an error), or a name in
// opts.Names matches no configuration (wrapping ErrNotFound). Problems of
// the webhooks themselves are findings, never errors.
func Run(ctx context.Context, cs kubernetes.Interface, opts Options) (*Report, error) {
	snap, err := LoadSnapshot(ctx, cs)
	if err != nil {
		return nil, err
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = DefaultConcurrency
	}
	return Diagnose(ctx, cs, snap, opts)
}

// Diagnose runs the checks over snap for the webhooks opts selects. It
// reads nothing from the API server except for probes (opts.Probe, through
// cs; cs may be nil otherwise); handshakes dial opts.Dial, or come from
// opts.Handshake. kadmit watch (internal/watch) calls it on a Snapshot it
// keeps current from informers, with its own handshake results.
func Diagnose(ctx context.Context, cs kubernetes.Interface, snap *Snapshot, opts Options) (*Report, error) {
	opts.defaults()
	r := newRun(cs, snap, opts)
	configNames := map[string]bool{}
	for _, w := range snap.Webhooks {
		configNames[w.Configuration] = true
	}
	want := map[string]bool{}
	for _, n := range opts.Names {
		if !configNames[n] {
			return nil, fmt.Errorf("%w: no MutatingWebhookConfiguration or ValidatingWebhookConfiguration named %q", ErrNotFound, n)
		}
		want[n] = true
	}
	hookWanted := map[string]bool{}
	for _, n := range opts.Webhooks {
		hookWanted[n] = true
	}
	var em *ErrorMatch
	if opts.FromError != "" {
		var err error
		if em, err = ParseError(opts.FromError); err != nil {
			return nil, err
		}
		if em.Webhook != "" {
			em.Matched = em.selectFor(snap)
			if len(em.Matched) == 0 {
				if rep := em.staticReport(snap); rep != nil {
					return rep, nil // KD004: it lives outside the API
				}
				return nil, fmt.Errorf("%w: the message names webhook %q, which is in no MutatingWebhookConfiguration or ValidatingWebhookConfiguration (deleted since?%s)", ErrNotFound, em.Webhook, notFoundHint(snap.ServerVersion))
			}
			for _, k := range em.Matched {
				hookWanted[k] = true
			}
		}
	}

	rep := &Report{Gaps: snap.AllGaps(), FromError: em}
	var hooks []*Webhook // hooks[i] is rep.Webhooks[i]'s webhook
	for _, w := range r.all {
		if len(want) > 0 && !want[w.Configuration] {
			continue
		}
		if em != nil && em.Webhook == "" {
			break // a policy's message: no webhook is involved
		}
		if len(hookWanted) > 0 && !hookWanted[w.Configuration+"/"+w.Name] {
			continue
		}
		hooks = append(hooks, w)
		rep.Webhooks = append(rep.Webhooks, WebhookReport{Webhook: w.Name, Configuration: w.Configuration, Kind: w.Kind, FailurePolicy: string(w.FailurePolicy), Target: w.Target()})
	}
	// Webhooks are checked Concurrency at a time, each writing only its
	// own report; a webhook reached after ctx ended says it was not checked.
	var wg sync.WaitGroup
	sem := make(chan struct{}, opts.Concurrency)
	notChecked := 0
	for i := range rep.Webhooks {
		wr, w := &rep.Webhooks[i], hooks[i]
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			notChecked++
			wr.Findings = []Finding{notCheckedFinding(ctx, "no check was made")}
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			wr.Findings = r.check(ctx, w)
			if opts.Probe {
				wr.Findings = append(wr.Findings, r.probe(ctx, w)...)
			}
			if ctx.Err() != nil {
				wr.Findings = append(wr.Findings, notCheckedFinding(ctx, "checks after it, handshakes and probes included, were cut short and may be missing"))
			}
		}()
	}
	wg.Wait()
	if (len(want) == 0 && len(hookWanted) == 0) || (em != nil && em.Policy != "") {
		rep.Policies = checkPolicies(snap.Policies, snap.ServerVersion)
	}
	if em != nil {
		em.explain(rep, snap.ServerVersion)
	}
	rep.finish()
	if err := ctx.Err(); err != nil {
		return rep, fmt.Errorf("%w: %d of %d webhook(s) not checked, others cut short: %w", ErrIncomplete, notChecked, len(rep.Webhooks), err)
	}
	return rep, nil
}

// notCheckedFinding says that the run ended (ctx's error) before what
// ended was checked.
func notCheckedFinding(ctx context.Context, what string) Finding {
	return Finding{ID: IDNotChecked, Severity: SeverityWarning,
		What: fmt.Sprintf("The run ended (%v) before this webhook was checked through: %s.", ctx.Err(), what),
		Why:  "Doctor's --timeout bounds the whole run; what it did not check may still be broken.",
		Fix:  "kadmit doctor --timeout 5m <configuration>  # a longer bound, or fewer configurations at a time"}
}

// check runs checks 1-6 and 8 for one webhook.
func (r *run) check(ctx context.Context, w *Webhook) []Finding {
	var out []Finding
	var collision *Collision
	if w.ClientConfig.Service != nil {
		var fs []Finding
		fs, collision = r.checkService(ctx, w)
		out = append(out, fs...)
	} else {
		out = append(out, r.checkURL(ctx, w)...)
	}
	out = append(out, r.checkInterception(ctx, w)...)
	out = append(out, conditionFindings(w)...)
	out = append(out, r.checkSettings(w, collision)...)
	out = append(out, r.checkTimeoutBudget(w)...)
	out = append(out, r.checkFieldOwners(w)...)
	out = append(out, r.checkVersionRules(w)...)
	out = append(out, r.checkDependencies(ctx, w)...)
	out = append(out, r.checkTermination(w)...)
	out = append(out, r.checkNetworkPolicies(w)...)
	// What doctor could not read for this webhook, so that every check
	// that could not be made says so.
	gaps := append([]AccessGap(nil), r.snap.Gaps...)
	if b := r.backends[w.ServiceKey()]; b != nil {
		gaps = append(gaps, b.Gaps...)
	}
	out = append(out, gapFindings(gaps)...)
	return out
}

// consequence says what a failing call does to matched requests.
func consequence(w *Webhook) string {
	if w.Fail() {
		return fmt.Sprintf("failurePolicy is Fail, so every request it matches (%s) is rejected: an outage for those resources.", describeRules(w.Rules))
	}
	return fmt.Sprintf("failurePolicy is Ignore, so matched requests (%s) are admitted without the webhook: its policy is silently not applied, and each request first waits for the failed call.", describeRules(w.Rules))
}

func describeRules(rules []admissionregistrationv1.RuleWithOperations) string {
	var parts []string
	for _, r := range rules {
		parts = append(parts, fmt.Sprintf("%s %s", joinOps(r.Operations), strings.Join(r.Resources, ",")))
	}
	if len(parts) == 0 {
		return "no rules"
	}
	return strings.Join(parts, "; ")
}

func joinOps(ops []admissionregistrationv1.OperationType) string {
	s := make([]string, len(ops))
	for i, o := range ops {
		s[i] = string(o)
	}
	return strings.Join(s, ",")
}

// checkService runs checks 1, 2, 3, 4 and 8 for a Service webhook. It
// returns the selector collision (KD301) it found, nil if none, for the
// checks that depend on the Service's selector (KD605).
func (r *run) checkService(ctx context.Context, w *Webhook) ([]Finding, *Collision) {
	s := w.ClientConfig.Service
	b := r.backends[w.ServiceKey()]
	var out []Finding
	if !b.NamespaceExists {
		return append(out, Finding{ID: IDOrphan, Severity: SeverityError,
			What: fmt.Sprintf("The webhook calls Service %s/%s, but namespace %s does not exist: the configuration is an orphan of an uninstalled component.", s.Namespace, s.Name, s.Namespace),
			Why:  "The API server cannot resolve the Service (\"service \\\"" + s.Name + "\\\" not found\"); " + consequence(w),
			Fix:  fmt.Sprintf("kubectl delete %s %s", w.resourceKind(), w.Configuration),
		}), nil
	}
	for _, ci := range analyzeBundle(w.ClientConfig.CABundle, true, r.o.Now()) {
		out = append(out, Finding{ID: ci.ID, Severity: ci.Severity, What: ci.What, Why: ci.Why, Fix: bundleFix(w)})
	}
	if b.ServiceUnknown {
		return out, nil // the access gap (KD001) says what is unknown
	}
	if b.Service == nil {
		return append(out, Finding{ID: IDServiceMissing, Severity: SeverityError,
			What: fmt.Sprintf("Service %s/%s does not exist.", s.Namespace, s.Name),
			Why:  fmt.Sprintf("The API server fails every call with \"service \\\"%s\\\" not found\"; %s", s.Name, consequence(w)),
			Fix:  fmt.Sprintf("Create Service %s/%s (port %d) selecting the webhook's pods, or remove the configuration: kubectl delete %s %s", s.Namespace, s.Name, w.ServicePort(), w.resourceKind(), w.Configuration),
		}), nil
	}
	svc := b.Service
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return append(out, Finding{ID: IDServiceType, Severity: SeverityError,
			What: fmt.Sprintf("Service %s/%s is of type ExternalName.", s.Namespace, s.Name),
			Why:  "The API server only calls ClusterIP, NodePort and LoadBalancer Services (\"unsupported service type\"); " + consequence(w),
			Fix:  fmt.Sprintf("Point the webhook at a ClusterIP Service, or use clientConfig.url with the external name: kubectl edit %s %s", w.resourceKind(), w.Configuration),
		}), nil
	}
	var svcPort *corev1.ServicePort
	var ports []string
	for i := range svc.Spec.Ports {
		ports = append(ports, strconv.Itoa(int(svc.Spec.Ports[i].Port)))
		if svc.Spec.Ports[i].Port == w.ServicePort() {
			svcPort = &svc.Spec.Ports[i]
		}
	}
	if svcPort == nil {
		f := Finding{ID: IDServicePortMissing, Severity: SeverityError,
			What: fmt.Sprintf("Service %s/%s does not expose port %d (clientConfig.service.port); it exposes: %s.", s.Namespace, s.Name, w.ServicePort(), strings.Join(ports, ", ")),
			Why:  fmt.Sprintf("The API server fails every call with \"no service port %d found for service \\\"%s\\\"\"; %s", w.ServicePort(), s.Name, consequence(w)),
		}
		if len(svc.Spec.Ports) == 1 {
			f.Fix = jsonPatchCommand(w, []map[string]any{{"op": "add", "path": fmt.Sprintf("/webhooks/%d/clientConfig/service/port", w.Index), "value": svc.Spec.Ports[0].Port}})
		} else {
			f.Fix = fmt.Sprintf("Set clientConfig.service.port of webhook %s to one of %s: kubectl edit %s %s", w.Name, strings.Join(ports, ", "), w.resourceKind(), w.Configuration)
		}
		return append(out, f), nil
	}

	eps, portFound := b.endpointsFor(svcPort.Name)
	out = append(out, r.checkTargetPort(w, b, svcPort, eps, portFound)...)
	var ready []endpoint
	for _, e := range eps {
		if e.Ready {
			ready = append(ready, e)
		}
	}
	if len(ready) == 0 && !b.SlicesUnknown {
		out = append(out, noReadyEndpoint(w, b, svcPort.Name, eps, portFound))
	}

	// Handshake each ready endpoint as the API server would.
	okWorkloads := map[WorkloadRef]bool{}
	badWorkloads := map[WorkloadRef]bool{}
	addrByPod := map[string]string{}
	for _, e := range eps {
		if e.PodName != "" {
			addrByPod[e.PodName] = e.Address
		}
	}
	unreachable := 0
	for i, e := range ready {
		if i >= r.o.MaxEndpoints {
			out = append(out, Finding{ID: IDEndpointUnreachable, Severity: SeverityInfo,
				What: fmt.Sprintf("Only the first %d of %d ready endpoints were handshaken.", r.o.MaxEndpoints, len(ready))})
			break
		}
		fs, reached, certOK, pending := r.checkEndpoint(ctx, w, e.HostPort(), w.ServerName())
		out = append(out, fs...)
		if !reached && !pending {
			unreachable++
		}
		if ref, ok := b.Workload[e.PodName]; ok && reached {
			if certOK {
				okWorkloads[ref] = true
			} else {
				badWorkloads[ref] = true
			}
		}
	}
	if unreachable > 0 {
		out = append(out, Finding{ID: IDEndpointUnreachable, Severity: SeverityInfo,
			What: fmt.Sprintf("%d of %d ready endpoint(s) could not be reached from here, so their TLS handshake was not made.", unreachable, min(len(ready), r.o.MaxEndpoints)),
			Why:  "Pod IPs are usually not routable from outside the cluster; the API server may still reach them.",
			Fix:  fmt.Sprintf("kadmit doctor --probe %s  # let the API server call the webhook (server-side dry-run)", w.Configuration),
		})
	}

	c := FindCollision(s.Name, b.podInfos(addrByPod), func(ref WorkloadRef) bool { return okWorkloads[ref] && !badWorkloads[ref] })
	if c != nil {
		out = append(out, collisionFinding(w, svc, c))
	}
	return out, c
}

// noReadyEndpoint is KD201, saying why no endpoint is ready. The endpoint
// controller keeps a placeholder EndpointSlice without ports or endpoints
// for a Service that selects no pod, so a missing port name only means a
// port problem when the slices do list endpoints; otherwise the cause is
// the pods (none selected, or none started yet).
func noReadyEndpoint(w *Webhook, b *Backend, portName string, eps []endpoint, portFound bool) Finding {
	svc := b.Service
	sel := labels.SelectorFromSet(svc.Spec.Selector).String()
	listed := 0
	for _, sl := range b.Slices {
		listed += len(sl.Endpoints)
	}
	fix := fmt.Sprintf("kubectl -n %s get pods -l %s; kubectl -n %s describe pods -l %s  # find why the webhook pods are not ready", svc.Namespace, sel, svc.Namespace, sel)
	var state string
	switch {
	case len(eps) > 0:
		state = fmt.Sprintf("its %d endpoint(s) are all not ready (webhook pods not ready; %d pod(s) selected)", len(eps), len(b.Pods))
	case listed > 0 && !portFound:
		state = fmt.Sprintf("its EndpointSlices list %d endpoint(s) but carry no port named %q, the Service port's name (stale or hand-made EndpointSlices)", listed, portName)
		fix = fmt.Sprintf("kubectl -n %s get endpointslices -l kubernetes.io/service-name=%s -o yaml  # the port name must be %q, or let the endpoint controller manage them", svc.Namespace, svc.Name, portName)
	case len(b.Pods) == 0 && !b.PodsUnknown && len(svc.Spec.Selector) > 0:
		state = fmt.Sprintf("no pod is selected (selector %q matches no pod in %s", sel, svc.Namespace)
		var runNone []string
		for _, t := range b.Templates {
			runNone = append(runNone, t.Workload.String())
		}
		if len(runNone) > 0 {
			state += "; " + strings.Join(runNone, ", ") + " runs none"
		}
		state += ")"
		fix = fmt.Sprintf("kubectl -n %s get events --field-selector reason=FailedCreate; kubectl -n %s get deployments,replicasets -l %s  # find why no webhook pod exists", svc.Namespace, svc.Namespace, sel)
	case len(b.Pods) > 0:
		state = fmt.Sprintf("no pod is ready (%d pod(s) selected, none in its EndpointSlices yet: not started or not ready)", len(b.Pods))
	default:
		state = "it has no EndpointSlice endpoints at all (webhook pods not started or not ready)"
	}
	return Finding{ID: IDNoReadyEndpoints, Severity: SeverityError,
		What: fmt.Sprintf("Service %s/%s has no ready endpoint: %s.", svc.Namespace, svc.Name, state),
		Why:  "The API server gets \"no endpoints available for service\" (with --enable-aggregator-routing) or \"connection refused\" (through the ClusterIP); " + consequence(w),
		Fix:  fix,
	}
}

// checkTargetPort compares the Service's targetPort with the pods' declared
// container ports and with the port the EndpointSlices carry.
func (r *run) checkTargetPort(w *Webhook, b *Backend, sp *corev1.ServicePort, eps []endpoint, portFound bool) []Finding {
	var out []Finding
	svc := b.Service
	tp := sp.TargetPort
	if tp.Type == intstr.Int && tp.IntVal == 0 {
		tp = intstr.FromInt32(sp.Port)
	}
	specs := make([]struct {
		name string
		spec corev1.PodSpec
	}, 0, len(b.Pods)+len(b.Templates))
	for _, p := range b.Pods {
		specs = append(specs, struct {
			name string
			spec corev1.PodSpec
		}{"pod " + p.Name, p.Spec})
	}
	for _, t := range b.Templates {
		specs = append(specs, struct {
			name string
			spec corev1.PodSpec
		}{"template of " + t.Workload.String(), t.Spec})
	}
	for _, ps := range specs {
		declared, named := containerPorts(ps.spec)
		switch {
		case tp.Type == intstr.String:
			if _, ok := named[tp.StrVal]; !ok {
				out = append(out, Finding{ID: IDTargetPortMismatch, Severity: SeverityError,
					What: fmt.Sprintf("Service %s/%s port %d has targetPort %q, but %s declares no container port with that name.", svc.Namespace, svc.Name, sp.Port, tp.StrVal, ps.name),
					Why:  "The endpoints controller cannot resolve the name, so the pod is left out of the EndpointSlices: the API server finds no endpoint; " + consequence(w),
					Fix:  fmt.Sprintf("Name the webhook container's port %q, or set the Service's targetPort to its number: kubectl -n %s edit service %s", tp.StrVal, svc.Namespace, svc.Name),
				})
				return out
			}
		case len(declared) > 0 && !declared[tp.IntVal]:
			out = append(out, Finding{ID: IDTargetPortMismatch, Severity: SeverityWarning,
				What: fmt.Sprintf("Service %s/%s port %d has targetPort %d, but %s declares container ports %s.", svc.Namespace, svc.Name, sp.Port, tp.IntVal, ps.name, formatPorts(declared)),
				Why:  "If the webhook listens on a declared port, calls go to a port nothing listens on: \"connection refused\".",
				Fix:  fmt.Sprintf("kubectl -n %s patch service %s --type=json -p '[{\"op\":\"replace\",\"path\":\"/spec/ports/%d/targetPort\",\"value\":%d}]'", svc.Namespace, svc.Name, portIndex(svc, sp.Port), firstPort(declared)),
			})
			return out
		}
	}
	if tp.Type == intstr.Int && portFound {
		for _, e := range eps {
			if e.Port != tp.IntVal {
				out = append(out, Finding{ID: IDTargetPortMismatch, Severity: SeverityWarning,
					What: fmt.Sprintf("Service %s/%s has targetPort %d, but its EndpointSlices send port %q to %d.", svc.Namespace, svc.Name, tp.IntVal, sp.Name, e.Port),
					Why:  "The EndpointSlices are stale or managed by hand: the API server dials the slice's port, not the Service's targetPort.",
					Fix:  fmt.Sprintf("kubectl -n %s get endpointslices -l kubernetes.io/service-name=%s -o yaml  # fix the port, or let the endpoint controller manage them", svc.Namespace, svc.Name),
				})
				break
			}
		}
	}
	return out
}

func containerPorts(spec corev1.PodSpec) (map[int32]bool, map[string]int32) {
	nums, names := map[int32]bool{}, map[string]int32{}
	for _, c := range spec.Containers {
		for _, p := range c.Ports {
			nums[p.ContainerPort] = true
			if p.Name != "" {
				names[p.Name] = p.ContainerPort
			}
		}
	}
	return nums, names
}

func formatPorts(m map[int32]bool) string {
	var s []string
	for p := range m {
		s = append(s, strconv.Itoa(int(p)))
	}
	sort.Strings(s)
	return strings.Join(s, ", ")
}

func firstPort(m map[int32]bool) int32 {
	var best int32
	for p := range m {
		if best == 0 || p < best {
			best = p
		}
	}
	return best
}

func portIndex(svc *corev1.Service, port int32) int {
	for i, p := range svc.Spec.Ports {
		if p.Port == port {
			return i
		}
	}
	return 0
}

func collisionFinding(w *Webhook, svc *corev1.Service, c *Collision) Finding {
	var names []string
	for _, g := range c.Groups {
		where := ""
		if len(g.Addresses) > 0 {
			where = " at " + strings.Join(g.Addresses, ", ")
		}
		names = append(names, fmt.Sprintf("%s (pods %s%s)", g.Workload, strings.Join(g.Pods, ", "), where))
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector).String()
	f := Finding{ID: IDSelectorCollision, Severity: SeverityError,
		What: fmt.Sprintf("Service %s/%s selects pods of %d workloads with selector %q: %s.", svc.Namespace, svc.Name, len(c.Groups), sel, strings.Join(names, "; ")),
		Why: fmt.Sprintf("The API server picks an endpoint at random for each call, so some calls land on a pod of another controller, which serves its own certificate: those calls fail intermittently (typically \"x509: certificate is valid for <other>-service.%s.svc, not %s\") or reach the wrong handler; %s",
			svc.Namespace, w.ServerName(), consequence(w)),
	}
	if !c.Proven {
		// No error on an owner doctor could not read: the groups may be one
		// workload seen through unreadable ReplicaSets.
		f.Severity = SeverityWarning
		f.What = cannotTell(strings.Replace(f.What, " selects pods of ", " seems to select pods of ", 1),
			append([]string{"fewer than two of these workloads rest on owner references doctor could read"}, c.Unsure...))
	}
	own := c.Groups[0].Workload
	switch {
	case c.LabelKey != "" && c.Intended:
		f.Fix = fmt.Sprintf("kubectl -n %s patch service %s --type=merge -p '{\"spec\":{\"selector\":{%q:%q}}}'  # label %s=%s is carried only by %s's pods; keep it in that pod template",
			svc.Namespace, svc.Name, c.LabelKey, c.LabelValue, c.LabelKey, c.LabelValue, own)
	case c.LabelKey != "":
		f.Fix = fmt.Sprintf("Add to the Service's selector a label only the webhook's own pods carry; if %s is the webhook's workload: kubectl -n %s patch service %s --type=merge -p '{\"spec\":{\"selector\":{%q:%q}}}'",
			own, svc.Namespace, svc.Name, c.LabelKey, c.LabelValue)
	default:
		f.Fix = fmt.Sprintf("Give the webhook's pod template a label no other workload in %s has (e.g. app.kubernetes.io/name: <component>) and add it to Service %s's selector; or move the controllers into separate namespaces.",
			svc.Namespace, svc.Name)
	}
	return f
}

// checkURL runs checks 1 and 4 for a URL webhook.
func (r *run) checkURL(ctx context.Context, w *Webhook) []Finding {
	var out []Finding
	if w.ClientConfig.URL == nil {
		return append(out, Finding{ID: IDServiceMissing, Severity: SeverityError,
			What: "clientConfig has neither service nor url.",
			Why:  "The API server cannot call the webhook; " + consequence(w),
			Fix:  fmt.Sprintf("kubectl edit %s %s  # set clientConfig.service", w.resourceKind(), w.Configuration)})
	}
	u, err := url.Parse(*w.ClientConfig.URL)
	if err != nil || u.Hostname() == "" {
		return append(out, Finding{ID: IDServiceMissing, Severity: SeverityError,
			What: fmt.Sprintf("clientConfig.url %q does not parse as an https URL with a host.", *w.ClientConfig.URL),
			Why:  "The API server cannot call the webhook; " + consequence(w),
			Fix:  fmt.Sprintf("kubectl edit %s %s", w.resourceKind(), w.Configuration)})
	}
	host := strings.ToLower(u.Hostname())
	if svc, ns, ok := clusterDNSName(host); ok {
		port := int32(443)
		if p, err := strconv.Atoi(u.Port()); err == nil {
			port = int32(p)
		}
		ref := map[string]any{"namespace": ns, "name": svc, "port": port}
		if u.Path != "" {
			ref["path"] = u.Path
		}
		out = append(out, Finding{ID: IDURLClusterDNS, Severity: SeverityError,
			What: fmt.Sprintf("clientConfig.url %q names an in-cluster Service through cluster DNS.", *w.ClientConfig.URL),
			Why:  "The API server resolves URLs with its host's resolver, which normally does not know cluster DNS: calls fail with \"no such host\"; " + consequence(w),
			Fix: jsonPatchCommand(w, []map[string]any{
				{"op": "remove", "path": fmt.Sprintf("/webhooks/%d/clientConfig/url", w.Index)},
				{"op": "add", "path": fmt.Sprintf("/webhooks/%d/clientConfig/service", w.Index), "value": ref},
			}),
		})
	} else if isLoopbackHost(host) {
		out = append(out, Finding{ID: IDURLLocalhost, Severity: SeverityWarning,
			What: fmt.Sprintf("clientConfig.url %q points at the API server's own host.", *w.ClientConfig.URL),
			Why:  "Only a webhook running on every API server host's network (or a development setup) answers there; anywhere else calls fail with \"connection refused\".",
			Fix:  fmt.Sprintf("For an in-cluster webhook use clientConfig.service: kubectl edit %s %s", w.resourceKind(), w.Configuration),
		})
	}
	for _, ci := range analyzeBundle(w.ClientConfig.CABundle, false, r.o.Now()) {
		out = append(out, Finding{ID: ci.ID, Severity: ci.Severity, What: ci.What, Why: ci.Why, Fix: bundleFix(w)})
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	fs, reached, _, pending := r.checkEndpoint(ctx, w, net.JoinHostPort(u.Hostname(), port), u.Hostname())
	out = append(out, fs...)
	if !reached && !pending {
		out = append(out, Finding{ID: IDEndpointUnreachable, Severity: SeverityInfo,
			What: fmt.Sprintf("%s could not be reached from here, so its TLS handshake was not made.", u.Host),
			Fix:  fmt.Sprintf("kadmit doctor --probe %s  # let the API server call the webhook (server-side dry-run)", w.Configuration)})
	}
	return out
}

// clusterDNSName recognises <svc>.<ns>.svc[.<domain>].
func clusterDNSName(host string) (svc, ns string, ok bool) {
	parts := strings.Split(host, ".")
	for i := 2; i < len(parts); i++ {
		if parts[i] == "svc" && i == 2 {
			return parts[0], parts[1], true
		}
	}
	return "", "", false
}

func bundleFix(w *Webhook) string {
	if w.ClientConfig.Service != nil {
		return fmt.Sprintf("Put the CA that signs the serving certificate of %s into caBundle (cert-manager: annotate the configuration with cert-manager.io/inject-ca-from=<ns>/<certificate>): kubectl patch %s %s --type=json -p '[{\"op\":\"replace\",\"path\":\"/webhooks/%d/clientConfig/caBundle\",\"value\":\"'$(base64 -w0 ca.crt)'\"}]'",
			w.ServerName(), w.resourceKind(), w.Configuration, w.Index)
	}
	return fmt.Sprintf("kubectl patch %s %s --type=json -p '[{\"op\":\"replace\",\"path\":\"/webhooks/%d/clientConfig/caBundle\",\"value\":\"'$(base64 -w0 ca.crt)'\"}]'", w.resourceKind(), w.Configuration, w.Index)
}

// sharedHandshake handshakes addr as serverName once per run: a webhook
// wanting an endpoint another is handshaking waits for its result, and
// past MaxHandshakes distinct endpoints the result is errHandshakeBound.
func (r *run) sharedHandshake(ctx context.Context, addr, serverName string) ([]*x509.Certificate, error) {
	key := addr + "|" + serverName
	r.mu.Lock()
	h, ok := r.handshakes[key]
	switch {
	case ok:
		r.mu.Unlock()
		<-h.done
	case len(r.handshakes) >= r.o.MaxHandshakes:
		r.mu.Unlock()
		return nil, errHandshakeBound
	default:
		h = &handshakeResult{done: make(chan struct{})}
		r.handshakes[key] = h
		r.mu.Unlock()
		h.chain, h.err = r.handshake(ctx, addr, serverName)
		close(h.done)
	}
	return h.chain, h.err
}

// checkEndpoint handshakes addr ("ip:port") with serverName and the
// webhook's caBundle as the only root, and analyses the certificate. reached
// is false when the address cannot be dialled from here (no finding then);
// certOK is true when the certificate passes every check that breaks calls.
//
// pending is true when the Handshake seam has no result yet: no finding,
// and the endpoint counts neither as reached nor as unreachable.
func (r *run) checkEndpoint(ctx context.Context, w *Webhook, addr, serverName string) (out []Finding, reached, certOK, pending bool) {
	var res handshakeResult
	if r.o.Handshake != nil {
		res.chain, res.err = r.o.Handshake(ctx, w, addr, serverName)
	} else {
		res.chain, res.err = r.sharedHandshake(ctx, addr, serverName)
	}
	if res.err != nil {
		switch {
		case errors.Is(res.err, ErrHandshakePending):
			return nil, false, false, true
		case errors.Is(res.err, errHandshakeBound):
			return []Finding{{ID: IDNotChecked, Severity: SeverityInfo, Endpoint: addr,
				What: fmt.Sprintf("Endpoint %s was not handshaken: this run already dialed %d endpoints, its bound.", addr, r.o.MaxHandshakes),
				Why:  "Doctor dials at most --max-handshakes distinct endpoints per run, so a cluster with many webhooks costs a bounded number of connections and time.",
				Fix:  "kadmit doctor <configuration>  # check this configuration alone, or raise --max-handshakes"}}, false, false, true
		case errors.Is(res.err, syscall.ECONNREFUSED):
			return []Finding{{ID: IDEndpointRefused, Severity: SeverityError, Endpoint: addr,
				What: fmt.Sprintf("Endpoint %s refuses connections: nothing listens there.", addr),
				Why:  fmt.Sprintf("The API server gets \"dial tcp %s: connect: connection refused\" whenever it picks this endpoint; %s", addr, consequence(w)),
				Fix:  "Make the pod report ready only once its webhook server listens (readiness probe on the webhook port or on a check that waits for the certificate), and check the webhook's listen port against the Service targetPort.",
			}}, true, false, false
		case r.o.InCluster && w.ClientConfig.Service != nil && isTimeoutOrNoRoute(res.err):
			// Only for Service endpoints: the API server reaches them over
			// the pod network too, while a URL may be reachable from the
			// API server's host and not from a pod (egress rules).
			return []Finding{{ID: IDHandshakeFailed, Severity: SeverityError, Endpoint: addr,
				What: fmt.Sprintf("Endpoint %s (ServerName %s) did not complete a TLS handshake within %s: %v.", addr, serverName, r.o.HandshakeTimeout, res.err),
				Why:  "The API server, on the same pod network, waits the same way until the webhook's timeoutSeconds runs out; " + consequence(w),
				Fix:  "Check that the webhook pod is running and not overloaded (kubectl top pod; kubectl logs), and that no NetworkPolicy drops traffic to its port.",
			}}, true, false, false
		case errors.Is(res.err, ErrDialNotAllowed), isTimeoutOrNoRoute(res.err), isDNSError(res.err):
			return nil, false, false, false
		default:
			return []Finding{{ID: IDHandshakeFailed, Severity: SeverityError, Endpoint: addr,
				What: fmt.Sprintf("TLS handshake with %s (ServerName %s) failed: %v.", addr, serverName, res.err),
				Why:  "The API server's handshake fails the same way; " + consequence(w),
				Fix:  "Check that the webhook serves HTTPS on this port with its serving certificate: kubectl logs on the webhook pod.",
			}}, true, false, false
		}
	}
	certOK = true
	for _, ci := range analyzeServing(res.chain, w.ClientConfig.CABundle, serverName, r.o.Now(), r.o.ExpiryWarning) {
		if ci.Severity == SeverityError {
			certOK = false
		}
		out = append(out, Finding{ID: ci.ID, Severity: ci.Severity, Endpoint: addr,
			What: fmt.Sprintf("Endpoint %s: %s", addr, ci.What), Why: ci.Why, Fix: servingFix(w, ci.ID)})
	}
	return out, true, certOK, false
}

// isTimeoutOrNoRoute: the endpoint did not answer in time or has no route.
func isTimeoutOrNoRoute(err error) bool {
	return errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || isDialTimeout(err)
}

// isDNSError: a host name doctor cannot resolve (cluster DNS from a laptop)
// says nothing about what the API server sees.
func isDNSError(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de)
}

func isDialTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func servingFix(w *Webhook, id string) string {
	switch id {
	case IDSANMismatch:
		if w.ClientConfig.Service != nil {
			s := w.ClientConfig.Service
			return fmt.Sprintf("If this pod belongs to another workload, narrow Service %s/%s's selector (see %s). Otherwise reissue the serving certificate with SANs %s, %s.%s, %s and %s.cluster.local.",
				s.Namespace, s.Name, IDSelectorCollision, s.Name, s.Name, s.Namespace, w.ServerName(), w.ServerName())
		}
		return "Reissue the serving certificate with the URL's host as a SAN."
	case IDUnknownAuthority:
		return "Make caBundle and the serving certificate agree: inject the CA that signed the serving certificate into caBundle (" + bundleFix(w) + "), or restart the webhook pods so they load a certificate from the CA in caBundle."
	case IDServingCertExpiry:
		return "Renew the serving certificate and make the webhook reload it (cert-manager: kubectl cert-manager renew <certificate>; else restart the pods after renewal)."
	case IDWeakKey:
		return "Reissue the serving certificate with an ECDSA P-256 or RSA 2048+ key."
	case IDSHA1Signature:
		return "Reissue the certificate (and any intermediate) signed with SHA-256 or better."
	case IDCABundleExpired:
		return "Rotate the CA: issue a new CA, put it into caBundle, then reissue the serving certificate from it."
	default:
		return "Compare the webhook's certificate with caBundle: openssl s_client -connect <endpoint> -servername " + w.ServerName()
	}
}

// handshake dials addr with the configured DialFunc and returns the chain
// Handshake gets.
func (r *run) handshake(ctx context.Context, addr, serverName string) ([]*x509.Certificate, error) {
	return Handshake(ctx, r.o.Dial, r.o.HandshakeTimeout, addr, serverName)
}

// Handshake dials addr ("ip:port" or "host:port") with dial and makes a TLS
// handshake with serverName (SNI), offering http/1.1, within timeout. It
// does not verify the chain (analyzeServing does, against the caBundle, so
// every problem can be named) and returns the peer's chain, leaf first.
//
// Errors: the dial error as dial returned it (syscall.ECONNREFUSED,
// timeouts, ErrDialNotAllowed ...), or "tls handshake: %w".
func Handshake(ctx context.Context, dial DialFunc, timeout time.Duration, addr, serverName string) ([]*x509.Certificate, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	raw, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer raw.Close()
	// Verification is done by analyzeServing against the caBundle, with
	// each failure named; the handshake itself must not stop at the first.
	conn := tls.Client(raw, &tls.Config{ServerName: serverName, InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}) //nolint:gosec // verified in analyzeServing
	if err := conn.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("tls handshake: %w", err)
	}
	return conn.ConnectionState().PeerCertificates, nil
}

func joinHostPort(host string, port int32) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

func opType(s string) admissionregistrationv1.OperationType {
	return admissionregistrationv1.OperationType(s)
}
