// Package watch is `kadmit watch`: an in-cluster controller that keeps
// doctor's checks current for every MutatingWebhookConfiguration and
// ValidatingWebhookConfiguration. Informers keep a doctor.Snapshot current
// (snapshot.go); an informer event re-evaluates after Options.Debounce; a
// bounded worker pool handshakes every ready endpoint each
// Options.HandshakeInterval (handshake.go); a warning or error finding
// becomes active only once confirmed (confirm.go); active findings become
// Prometheus series (metrics.go) and Kubernetes Events (events.go), on the
// leader only (leader.go). What one read cannot show, the configurations'
// update events record: each change of a webhook's caBundle or
// failurePolicy and the field manager behind it (history.go, KD609); the
// API server's version is read again every VersionInterval (version.go).
package watch

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kadmit/kadmit/internal/doctor"
)

// ErrUsage is wrapped by Options.Validate's errors: the flags are wrong.
var ErrUsage = errors.New("invalid options")

// Defaults of the options, as the flags of `kadmit watch` show them.
const (
	// DefaultHandshakeInterval is 20 s, not the 30 s first planned:
	// a fault that appears in place on an endpoint already handshaken (its
	// certificate swapped, its port refusing, a hang) is found at the next
	// handshake, confirmed DefaultConfirmDelay later, and a hang costs two
	// 3 s handshake timeouts: 20 + 2 + 2x3 = 28 s stays within the 30 s the
	// issue sets for detecting every failure class; at 30 s it would be 38 s.
	DefaultHandshakeInterval = 20 * time.Second
	DefaultDebounce          = 500 * time.Millisecond
	DefaultProbeInterval     = 5 * time.Minute
	DefaultProbeQPS          = 0.2
	DefaultMaxWebhooks       = 500
	// DefaultConfirmDelay is how soon a failed handshake or probe is
	// repeated before its finding may become active.
	DefaultConfirmDelay = 2 * time.Second
	// DefaultHandshakeWorkers bounds the handshakes in flight.
	DefaultHandshakeWorkers = 8
	// DefaultEventRepeat: an active finding's Warning is re-emitted at most
	// this often while it stays.
	DefaultEventRepeat = time.Hour
	// DefaultEventQPS and DefaultEventBurst: the token bucket all Events
	// of one replica share.
	DefaultEventQPS   = 1.0
	DefaultEventBurst = 20
)

// Options configure Run. Client is required; zero durations and counts
// take the defaults above.
type Options struct {
	// Client reads the cluster (informers, targeted GETs), writes Events
	// and the Lease, and makes the dry-run probes.
	Client kubernetes.Interface
	// Dynamic reads cert-manager Certificates named by
	// cert-manager.io/inject-ca-from; nil: those reads become access gaps.
	Dynamic dynamic.Interface
	// Namespace holds the Lease.
	Namespace string
	// LeaderElect: compete for the Lease LeaseName as Identity; false: this
	// replica always leads (one replica only).
	LeaderElect                               bool
	LeaseName, Identity                       string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	HandshakeInterval, Debounce, ConfirmDelay time.Duration
	// HandshakeTimeout bounds dial plus TLS handshake to one endpoint
	// (default 3s, doctor's).
	HandshakeTimeout time.Duration
	HandshakeWorkers int
	// MaxEndpoints bounds the endpoints handshaken (and the endpoint label
	// values) per webhook; default doctor's 10.
	MaxEndpoints int
	// MaxWebhooks bounds the webhooks tracked: series, Events, handshakes.
	MaxWebhooks int
	// Probe turns on dry-run probes: each tracked webhook every
	// ProbeInterval, at most ProbeQPS per second overall (burst 1).
	Probe         bool
	ProbeInterval time.Duration
	ProbeQPS      float64
	// EventRepeat, EventQPS and EventBurst: see the defaults.
	EventRepeat time.Duration
	EventQPS    float64
	EventBurst  int
	// Dial opens endpoint connections; default a net.Dialer. Tests
	// restrict it to loopback.
	Dial doctor.DialFunc
	// Now is the clock; default time.Now.
	Now func() time.Time
	Log *slog.Logger
}

// Validate checks the options a user sets and fills the defaults.
//
// Errors wrap ErrUsage and name the flag.
func (o *Options) Validate() error {
	if o.Client == nil {
		return fmt.Errorf("%w: no Kubernetes client", ErrUsage)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--handshake-interval", o.HandshakeInterval}, {"--debounce", o.Debounce}, {"--probe-interval", o.ProbeInterval},
		{"--lease-duration", o.LeaseDuration}, {"--renew-deadline", o.RenewDeadline}, {"--retry-period", o.RetryPeriod}} {
		if d.v < 0 {
			return fmt.Errorf("%w: %s must not be negative, got %s", ErrUsage, d.name, d.v)
		}
	}
	if o.ProbeQPS < 0 || o.MaxWebhooks < 0 {
		return fmt.Errorf("%w: --probe-qps and --max-webhooks must not be negative", ErrUsage)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.HandshakeInterval, DefaultHandshakeInterval)
	def(&o.Debounce, DefaultDebounce)
	def(&o.ConfirmDelay, DefaultConfirmDelay)
	def(&o.HandshakeTimeout, 3*time.Second)
	def(&o.ProbeInterval, DefaultProbeInterval)
	def(&o.EventRepeat, DefaultEventRepeat)
	def(&o.LeaseDuration, 15*time.Second)
	def(&o.RenewDeadline, 10*time.Second)
	def(&o.RetryPeriod, 2*time.Second)
	if o.HandshakeInterval < time.Second {
		return fmt.Errorf("%w: --handshake-interval must be at least 1s, got %s", ErrUsage, o.HandshakeInterval)
	}
	if o.LeaderElect && (o.RenewDeadline >= o.LeaseDuration || o.RetryPeriod >= o.RenewDeadline) {
		return fmt.Errorf("%w: need --retry-period < --renew-deadline < --lease-duration", ErrUsage)
	}
	if o.HandshakeWorkers <= 0 {
		o.HandshakeWorkers = DefaultHandshakeWorkers
	}
	if o.MaxEndpoints <= 0 {
		o.MaxEndpoints = 10
	}
	if o.MaxWebhooks == 0 {
		o.MaxWebhooks = DefaultMaxWebhooks
	}
	if o.ProbeQPS == 0 {
		o.ProbeQPS = DefaultProbeQPS
	}
	if o.EventQPS <= 0 {
		o.EventQPS = DefaultEventQPS
	}
	if o.EventBurst <= 0 {
		o.EventBurst = DefaultEventBurst
	}
	if o.Namespace == "" {
		o.Namespace = "kadmit-system"
	}
	if o.LeaseName == "" {
		o.LeaseName = "kadmit-watch"
	}
	if o.Dial == nil {
		var d net.Dialer
		o.Dial = d.DialContext
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}
