package watch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/kadmit/kadmit/internal/doctor"
)

// Controller is one replica of kadmit watch. Build it with New, run it
// with Run.
type Controller struct {
	o       Options
	cl      *cluster
	hs      *handshaker
	conf    *confirmer
	metrics *Metrics
	extra   *extraFindings
	rec     record.EventRecorder
	// events is non-nil while this replica leads; only the evaluation
	// loop touches it.
	events *events

	policies atomic.Pointer[doctor.PolicySet]
	leading  atomic.Bool
	synced   atomic.Bool
	kickCh   chan struct{}

	// Evaluation loop state.
	tracked       map[wkey]bool
	lastUntracked int
	counted       map[countKey]uint64
	wasLeading    bool
	states        atomic.Pointer[[]*webhookState]
	lastSnap      atomic.Pointer[doctor.Snapshot]
	// versionEvery is VersionInterval (tests shorten it).
	versionEvery time.Duration

	// usersMu guards users: which webhooks' series a handshake key feeds.
	usersMu sync.Mutex
	users   map[hsKey][]series
}

// New builds a controller: informer factory (informers registered by Run,
// once it knows what it may read), metrics
// on their own registry, Events through rec (nil: a client-go recorder
// writing core/v1 Events through o.Client is made by Run).
//
// Errors: the options are invalid (wrapping ErrUsage), or the informers or
// metrics could not be set up.
func New(o Options, rec record.EventRecorder) (*Controller, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	m, err := NewMetrics()
	if err != nil {
		return nil, err
	}
	c := &Controller{o: o, conf: newConfirmer(), metrics: m, extra: newExtraFindings(), rec: rec, kickCh: make(chan struct{}, 1),
		tracked: map[wkey]bool{}, counted: map[countKey]uint64{}, users: map[hsKey][]series{}, versionEvery: VersionInterval}
	c.cl = newCluster(o.Client, o.Now)
	c.hs = newHandshaker(&c.o, c.handshakeDone)
	if !o.LeaderElect {
		c.leading.Store(true)
	}
	return c, nil
}

// Metrics returns the controller's metrics (for /metrics and tests).
func (c *Controller) Metrics() *Metrics { return c.metrics }

// kick asks for an evaluation after the debounce; never blocks.
func (c *Controller) kick() {
	select {
	case c.kickCh <- struct{}{}:
	default:
	}
}

// handshakeDone observes the handshake for every webhook it serves and
// asks for an evaluation when the result is notable (see handshaker.done);
// unchanged successes wait for the periodic evaluation.
func (c *Controller) handshakeDone(k hsKey, r hsResult, notable bool) {
	c.usersMu.Lock()
	us := c.users[k]
	c.usersMu.Unlock()
	for _, p := range us {
		c.metrics.handshake(p, r.took)
	}
	if notable {
		c.kick()
	}
}

func (c *Controller) setUsers(u map[hsKey][]series) {
	c.usersMu.Lock()
	c.users = u
	c.usersMu.Unlock()
}

// Ready reports whether the informers have synced and one evaluation ran.
func (c *Controller) Ready() bool { return c.synced.Load() }

// Run starts the informers, the handshakes, the slow loops and leader
// election, serves /metrics, /healthz and /readyz on addr (empty: none),
// and evaluates on every debounced informer event, every handshake result
// that changed, and every HandshakeInterval, until ctx ends.
//
// Errors: the metrics listener could not be opened, the webhook
// configurations may not be listed and watched, or an evaluation
// failed (the informers' store is corrupt; wrapped). ctx ending is not an
// error.
func (c *Controller) Run(ctx context.Context, addr string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if c.rec == nil {
		b := record.NewBroadcaster(record.WithContext(ctx), record.WithCorrelatorOptions(record.CorrelatorOptions{
			// Our own token bucket and dedup decide what is sent; the
			// correlator's per-object spam filter (25 burst, one per 5
			// minutes) would otherwise drop the Events of a configuration
			// with many webhooks.
			QPS: float32(c.o.EventQPS), BurstSize: max(c.o.EventBurst, 25),
		}))
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.o.Client.CoreV1().Events("")})
		defer b.Shutdown()
		c.rec = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: eventComponent, Host: c.o.Identity})
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	if addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen on metrics address %s: %w", addr, err)
		}
		srv := &http.Server{Handler: c.Handler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10}
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				c.o.Log.Error("metrics server stopped", "error", err)
			}
		}()
		go func() {
			defer wg.Done()
			<-ctx.Done()
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer scancel()
			_ = srv.Shutdown(sctx)
		}()
	}
	unreadable, err := unreadableResources(ctx, c.o.Client)
	if err != nil {
		return err
	}
	if len(unreadable) > 0 {
		c.o.Log.Warn("some resources may not be listed and watched: the checks that need them report an access gap (KD001)", "resources", fmt.Sprint(unreadable))
	}
	if err := c.cl.register(unreadable, c.kick); err != nil {
		return err
	}
	// The version before the first evaluation, so that the version-aware
	// checks do not start from "unknown" and change a moment later.
	c.readVersion(ctx)
	c.cl.start(ctx)
	if err := c.cl.waitSynced(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	c.o.Log.Info("informers synced; watching webhooks", "handshakeInterval", c.o.HandshakeInterval, "debounce", c.o.Debounce, "probe", c.o.Probe)
	for _, f := range []func(context.Context){c.hs.run, c.slowLoop, c.elect, c.versionLoop} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(ctx)
		}()
	}
	if c.o.Probe {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.probeLoop(ctx)
		}()
	}
	return c.loop(ctx)
}

// loop evaluates until ctx ends: at once, then Debounce after the first
// of a burst of kicks, and at least every HandshakeInterval (certificates
// approach expiry without any event).
func (c *Controller) loop(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	armed := true
	periodic := time.NewTicker(c.o.HandshakeInterval)
	defer periodic.Stop()
	arm := func(d time.Duration) {
		if armed {
			return
		}
		armed = true
		timer.Reset(d)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.kickCh:
			arm(c.o.Debounce)
		case <-periodic.C:
			arm(0)
		case <-timer.C:
			armed = false
			reeval, err := c.step(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			if reeval {
				arm(c.o.Debounce)
			}
		}
	}
}

// step is one evaluation and its outputs: series and Events on the leader.
func (c *Controller) step(ctx context.Context) (reeval bool, err error) {
	states, reeval, err := c.evaluate(ctx)
	if err != nil {
		return false, err
	}
	c.states.Store(&states)
	lead := c.leading.Load()
	if lead != c.wasLeading {
		c.metrics.setLeader(lead)
		c.events = nil
		if lead {
			c.events = newEvents(c.o.Log, c.rec, c.o.EventQPS, c.o.EventBurst, c.o.EventRepeat)
			c.events.seed(ctx, c.o.Client.CoreV1().Events(metav1.NamespaceDefault).List, c.o.Now())
		}
		c.wasLeading = lead
	}
	if lead {
		c.metrics.publish(states)
		c.events.sync(c.o.Now(), states)
	}
	c.synced.Store(true)
	return reeval, nil
}

// Handler serves /metrics, /healthz and /readyz (503 until the informers
// synced and the first evaluation ran; a non-leader is ready too).
func (c *Controller) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(c.metrics.Registry(), promhttp.HandlerOpts{MaxRequestsInFlight: 4}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !c.Ready() {
			http.Error(w, "informers not synced\n", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
