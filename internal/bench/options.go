// Package bench load-tests an admission webhook the way the API server calls
// it: HTTPS POSTs of AdmissionReview requests over keep-alive connections,
// every answer checked, latency recorded in a bounded histogram.
//
// Run is bounded in both request count and time, and by default refuses any
// target that does not resolve only to loopback addresses.
package bench

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/kadmit/kadmit/internal/admission"
)

// Bounds on Options. Every run stops at MaxDuration and MaxRequests at the
// latest, whatever was asked.
const (
	MaxDuration     = 10 * time.Minute
	MinDuration     = 100 * time.Millisecond
	MaxRequests     = 10_000_000
	MaxConcurrency  = 1024
	DefaultDuration = 10 * time.Second
	// DefaultConcurrency matches the example; it is about what a busy
	// API server keeps in flight to one webhook.
	DefaultConcurrency = 64
	// DefaultTimeout is what the API server uses when a webhook sets no
	// timeoutSeconds.
	DefaultTimeout = 10 * time.Second
	MaxTimeout     = 60 * time.Second
	// MaxResponseBytes bounds the answer read per request: the patch for a
	// 3 MiB object plus the envelope fits.
	MaxResponseBytes = 8 << 20
)

// ErrOptions is wrapped by every Options validation error.
var ErrOptions = errors.New("invalid bench options")

// ErrRemoteTarget is wrapped when the URL's host resolves to an address that is
// not loopback and AllowRemote is false.
var ErrRemoteTarget = errors.New("target is not a loopback address")

// Options configure Run. The zero value of every field except URL has a
// default.
type Options struct {
	// URL is the webhook endpoint, https://HOST:PORT/PATH.
	URL string
	// RootCAs verifies the server certificate; nil means the system roots.
	RootCAs *x509.CertPool
	// Insecure skips certificate verification. Exclusive with RootCAs.
	Insecure bool
	// Manifest is one object as YAML or JSON; nil means DefaultPod().
	Manifest []byte
	// Operation is CREATE (default), UPDATE or DELETE. UPDATE sends the
	// object as both object and oldObject; DELETE sends only oldObject.
	Operation admissionv1.Operation
	// APIVersion is "v1" (default) or "v1beta1" (or the full
	// admission.k8s.io/... form).
	APIVersion string
	// Concurrency is the number of requests in flight, 1..MaxConcurrency;
	// 0 means DefaultConcurrency.
	Concurrency int
	// Duration stops issuing requests after this long, MinDuration..MaxDuration.
	// 0 means MaxDuration when Requests is set, DefaultDuration otherwise.
	Duration time.Duration
	// Requests stops after exactly this many requests, 1..MaxRequests;
	// 0 means MaxRequests. Whichever of Duration and Requests comes first
	// ends the run.
	Requests int64
	// Timeout bounds each request, 1ms..MaxTimeout; 0 means DefaultTimeout.
	Timeout time.Duration
	// HTTP2 uses HTTP/2 only (negotiated with ALPN); otherwise HTTP/1.1 only.
	HTTP2 bool
	// AllowRemote permits a host that resolves to non-loopback addresses.
	AllowRemote bool
	// Progress, when set, is called about once per second from a separate
	// goroutine while the run lasts. It must return quickly.
	Progress func(Progress)
}

// Progress is a snapshot of a running benchmark.
type Progress struct {
	Elapsed  time.Duration
	Requests int64 // completed, errors included
	Errors   int64
	// RPS is the completion rate over the last interval, in requests per second.
	RPS float64
}

// normalize checks o and fills in defaults. Errors wrap ErrOptions.
func (o Options) normalize() (Options, error) {
	u, err := url.Parse(o.URL)
	if err != nil {
		return o, fmt.Errorf("%w: --url: %w", ErrOptions, err)
	}
	if u.Scheme != "https" || u.Host == "" {
		return o, fmt.Errorf("%w: --url %q: must be https://HOST[:PORT]/PATH (webhooks are only called over HTTPS)", ErrOptions, o.URL)
	}
	if o.Insecure && o.RootCAs != nil {
		return o, fmt.Errorf("%w: --cacert and --insecure are exclusive", ErrOptions)
	}
	switch op := admissionv1.Operation(strings.ToUpper(string(o.Operation))); op {
	case "":
		o.Operation = admissionv1.Create
	case admissionv1.Create, admissionv1.Update, admissionv1.Delete:
		o.Operation = op
	default:
		return o, fmt.Errorf("%w: --operation %q: must be CREATE, UPDATE or DELETE", ErrOptions, o.Operation)
	}
	switch o.APIVersion {
	case "", "v1", admission.APIVersionV1:
		o.APIVersion = admission.APIVersionV1
	case "v1beta1", admission.APIVersionV1beta1:
		o.APIVersion = admission.APIVersionV1beta1
	default:
		return o, fmt.Errorf("%w: --api-version %q: must be v1 or v1beta1", ErrOptions, o.APIVersion)
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Concurrency < 1 || o.Concurrency > MaxConcurrency {
		return o, fmt.Errorf("%w: -c %d: must be 1..%d", ErrOptions, o.Concurrency, MaxConcurrency)
	}
	if o.Requests < 0 || o.Requests > MaxRequests {
		return o, fmt.Errorf("%w: -n %d: must be 1..%d", ErrOptions, o.Requests, MaxRequests)
	}
	if o.Duration < 0 || (o.Duration > 0 && o.Duration < MinDuration) || o.Duration > MaxDuration {
		return o, fmt.Errorf("%w: -d %s: must be %s..%s", ErrOptions, o.Duration, MinDuration, MaxDuration)
	}
	switch {
	case o.Duration == 0 && o.Requests == 0:
		o.Duration, o.Requests = DefaultDuration, MaxRequests
	case o.Duration == 0:
		o.Duration = MaxDuration
	case o.Requests == 0:
		o.Requests = MaxRequests
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Timeout < time.Millisecond || o.Timeout > MaxTimeout {
		return o, fmt.Errorf("%w: --timeout %s: must be 1ms..%s", ErrOptions, o.Timeout, MaxTimeout)
	}
	if o.Manifest == nil {
		o.Manifest = DefaultPod()
	}
	return o, nil
}
