package realcluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/kadmit/kadmit/test/cluster"

	"github.com/kadmit/kadmit/test/poll"
)

// The mutation that proves kadmit admitted a pod: the seed profile's
// lifespan policy (enabled by default, mutating webhook lifespan.kadmit.io
// on pod CREATE, failurePolicy Fail) turns the label
// acme.com/lifespan-requested: "N" into one toleration
// acme.com/lifespan-remaining=<i>:NoSchedule per i in N..14 (its default
// max). A load pod asks for LoadLifespan days, so an admitted pod without
// the toleration for day LoadLifespanMax bypassed kadmit.
const (
	LifespanLabel   = "acme.com/lifespan-requested"
	LifespanTaint   = "acme.com/lifespan-remaining"
	LoadLifespan    = "10"
	LoadLifespanMax = "14"
)

// EnsureNamespace creates namespace name (without labels, so kadmit's
// webhooks match it) unless it exists, and waits (at most 30 s) for its
// "default" ServiceAccount: until the controller-manager makes it, the
// ServiceAccount admission plugin refuses every pod there.
func EnsureNamespace(ctx context.Context, c *cluster.Cluster, name string) error {
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("realcluster: create namespace %s: %w", name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return poll.Until(ctx, 0, func(context.Context) error {
		_, err := c.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

// LoadPod returns the pod the load creates: what a Deployment's ReplicaSet
// would create (generateName, pod-template-hash, an owner reference, a
// container with requests, limits, probes and a restricted security
// context), labelled to request a lifespan of LoadLifespan days.
func LoadPod(namespace string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "web-7d9f8b6c5-",
			Namespace:    namespace,
			Labels: map[string]string{
				"app.kubernetes.io/name": "web", "pod-template-hash": "7d9f8b6c5",
				LifespanLabel: LoadLifespan,
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-7d9f8b6c5",
				UID: "5e0b9f8e-2c1a-4d7e-9a3b-0c6d2f1e4a5b", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "web", Image: cluster.PauseRef, ImagePullPolicy: corev1.PullNever,
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
				},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstrName("http")}}, PeriodSeconds: 5},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false), RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532),
					ReadOnlyRootFilesystem: ptr.To(true),
					Capabilities:           &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile:         &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
			}},
			TerminationGracePeriodSeconds: ptr.To[int64](30),
		},
	}
}

// Mutated reports whether p carries kadmit's lifespan mutation.
func Mutated(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Spec.Tolerations, func(t corev1.Toleration) bool {
		return t.Key == LifespanTaint && t.Value == LoadLifespanMax && t.Effect == corev1.TaintEffectNoSchedule
	})
}

// LoadOptions configure StartLoad.
type LoadOptions struct {
	// Namespace the pods are created in (dry run: nothing is stored); it
	// must exist and kadmit's webhooks must match it.
	Namespace string
	// Rate of creations per second (default 20), Max their count (default
	// Rate*Duration) and Duration the longest run (default 60 s): the load
	// stops at whichever bound comes first, or at Stop.
	Rate     float64
	Max      int
	Duration time.Duration
	// RequestTimeout bounds one creation (default 15 s: kadmit's webhooks
	// time out after 5 s, the API server's call chain stays below that).
	RequestTimeout time.Duration
	// MaxErrors bounds the distinct error messages kept (default 20).
	MaxErrors int
}

// Failure is one failed creation: when it was answered (relative to the
// load's start) and its error.
type Failure struct {
	At  time.Duration
	Err string
}

// Load is a running load of dry-run pod creations.
type Load struct {
	opts   LoadOptions
	cancel context.CancelFunc
	done   chan struct{}
	start  time.Time

	mu  sync.Mutex
	res LoadResult
}

// LoadResult counts a load's admissions.
type LoadResult struct {
	// Total creations answered; Failed answered with any error; Bypassed
	// admitted without kadmit's mutation (Mutated false). Total counts
	// every finished request, Failed and Bypassed included.
	Total, Failed, Bypassed int
	// Errors are the distinct error messages (at most MaxErrors) with their
	// counts; ErrorsDropped counts failures whose message was not kept.
	Errors        map[string]int
	ErrorsDropped int
	// FirstFailure and LastFailure are when failures happened (zero if
	// none), relative to the load's start; Failures are the first
	// MaxErrors of them, in the order answered, to line up with logs.
	FirstFailure, LastFailure time.Duration
	Failures                  []Failure
	// Duration from start to the last answer; Bounded is true when the
	// load stopped at Max or Duration rather than at Stop.
	Duration time.Duration
	Bounded  bool
	// Start is when the load started; FirstMutated is when the first
	// mutated pod was answered, relative to Start (0: none yet), and
	// BypassedBeforeFirstMutated counts the unmutated admissions answered
	// before it (kadmit not registered yet, when the load started before
	// the install): the time from an install to its first admitted pod.
	Start                      time.Time
	FirstMutated               time.Duration
	BypassedBeforeFirstMutated int
}

// String is a one-line summary with the distinct errors.
func (r LoadResult) String() string {
	s := fmt.Sprintf("%d creations in %s: %d failed, %d bypassed", r.Total, r.Duration.Round(time.Millisecond), r.Failed, r.Bypassed)
	if r.Failed > 0 {
		s += fmt.Sprintf(" (failures from %s to %s)", r.FirstFailure.Round(time.Millisecond), r.LastFailure.Round(time.Millisecond))
	}
	msgs := slices.Sorted(maps.Keys(r.Errors))
	for _, m := range msgs {
		s += fmt.Sprintf("\n  %d× %s", r.Errors[m], m)
	}
	if r.ErrorsDropped > 0 {
		s += fmt.Sprintf("\n  %d more failures with other messages", r.ErrorsDropped)
	}
	return s
}

// StartLoad starts creating LoadPod with server-side dry run at a fixed
// rate from its own client (so the test's client is not throttled by it),
// at most 64 at once. Stop it with Stop; it also stops at its bounds or
// when ctx ends.
func StartLoad(ctx context.Context, c *cluster.Cluster, opts LoadOptions) (*Load, error) {
	if opts.Rate == 0 {
		opts.Rate = 20
	}
	if opts.Duration == 0 {
		opts.Duration = time.Minute
	}
	if opts.Max == 0 {
		opts.Max = int(opts.Rate * opts.Duration.Seconds())
	}
	if opts.RequestTimeout == 0 {
		opts.RequestTimeout = 15 * time.Second
	}
	if opts.MaxErrors == 0 {
		opts.MaxErrors = 20
	}
	if opts.Namespace == "" {
		return nil, fmt.Errorf("realcluster: load: no namespace")
	}
	cfg := rest.CopyConfig(c.Config)
	cfg.QPS, cfg.Burst = float32(opts.Rate*2+10), int(opts.Rate*2+10)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("realcluster: load client: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	l := &Load{opts: opts, cancel: cancel, done: make(chan struct{}), start: time.Now()}
	l.res.Errors = map[string]int{}
	l.res.Start = l.start
	go l.run(ctx, cs)
	return l, nil
}

func (l *Load) run(ctx context.Context, cs kubernetes.Interface) {
	defer close(l.done)
	pod := LoadPod(l.opts.Namespace)
	bounded := Pace(ctx, l.opts.Rate, l.opts.Max, l.opts.Duration, func() {
		// Requests in flight finish even after Stop: an admission that
		// was started is counted.
		rctx, cancel := context.WithTimeout(context.Background(), l.opts.RequestTimeout)
		defer cancel()
		got, err := cs.CoreV1().Pods(l.opts.Namespace).Create(rctx, pod.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		l.record(got, err)
	})
	if bounded {
		l.setBounded()
	}
}

// PaceInFlight is how many of Pace's sends run at once at most.
const PaceInFlight = 64

// Pace runs send in its own goroutine rate times a second, at most
// PaceInFlight at once, until max sends were started, duration has passed
// or ctx ends, then waits for the sends in flight. It reports whether it
// stopped at max or duration (a bound) rather than at ctx's end. Every load
// of the real-cluster tests goes through it, so each is bounded in count,
// time and concurrency the same way.
func Pace(ctx context.Context, rate float64, max int, duration time.Duration, send func()) (bounded bool) {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, PaceInFlight)
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	deadline := time.NewTimer(duration)
	defer deadline.Stop()
	for sent := 0; ; {
		if sent >= max {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return true
		case <-tick.C:
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return false
		}
		sent++
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			send()
		}()
	}
}

func (l *Load) setBounded() {
	l.mu.Lock()
	l.res.Bounded = true
	l.mu.Unlock()
}

func (l *Load) record(p *corev1.Pod, err error) {
	at := time.Since(l.start)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.res.Total++
	l.res.Duration = at
	if err != nil {
		l.res.Failed++
		if l.res.FirstFailure == 0 {
			l.res.FirstFailure = at
		}
		l.res.LastFailure = at
		msg := strings.TrimSpace(err.Error())
		if len(l.res.Failures) < l.opts.MaxErrors {
			l.res.Failures = append(l.res.Failures, Failure{At: at, Err: msg})
		}
		if _, ok := l.res.Errors[msg]; ok || len(l.res.Errors) < l.opts.MaxErrors {
			l.res.Errors[msg]++
		} else {
			l.res.ErrorsDropped++
		}
		return
	}
	if !Mutated(p) {
		l.res.Bypassed++
		if l.res.FirstMutated == 0 {
			l.res.BypassedBeforeFirstMutated++
		}
		return
	}
	if l.res.FirstMutated == 0 {
		l.res.FirstMutated = at
	}
}

// Result returns the counts so far.
func (l *Load) Result() LoadResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.res
	r.Failures = slices.Clone(l.res.Failures)
	r.Errors = make(map[string]int, len(l.res.Errors))
	for k, v := range l.res.Errors {
		r.Errors[k] = v
	}
	return r
}

// Done is closed when the load has stopped and every request has been
// answered.
func (l *Load) Done() <-chan struct{} { return l.done }

// Stop stops sending, waits for the requests in flight and returns the
// result.
func (l *Load) Stop() LoadResult {
	l.cancel()
	<-l.done
	return l.Result()
}

func intstrName(name string) intstr.IntOrString { return intstr.FromString(name) }
