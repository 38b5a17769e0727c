package kueuecluster

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/deploy/realcluster"
)

// LoadJob is the Job the load creates: a one-pod Job labelled for
// LocalQueue, not suspended (Kueue's mutating webhook mjob.kb.io suspends
// a Job that names a queue: a suspended answer proves Kueue admitted it),
// with a restricted-compliant pod.
func LoadJob(namespace string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "load-",
			Namespace:    namespace,
			Labels:       map[string]string{QueueNameLabel: LocalQueue},
		},
		Spec: batchv1.JobSpec{
			Parallelism:  ptr.To[int32](1),
			Completions:  ptr.To[int32](1),
			BackoffLimit: ptr.To[int32](0),
			Suspend:      ptr.To(false),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "work", Image: cluster.PauseRef, ImagePullPolicy: corev1.PullNever,
					Resources: corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
					},
					SecurityContext: &corev1.SecurityContext{
						AllowPrivilegeEscalation: ptr.To(false), RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532),
						Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
				}},
			}},
		},
	}
}

// Call is one Job creation of the load.
type Call struct {
	// Sent is when the request left; Took how long the API server took to
	// answer.
	Sent time.Time
	Took time.Duration
	// Err is the API server's error message, verbatim ("" when created).
	Err string
	// Suspended is true when the created Job came back suspended, i.e.
	// Kueue's mutating webhook ran.
	Suspended bool
}

// LoadOptions bound a load.
type LoadOptions struct {
	// Rate of creations per second (default 20).
	Rate float64
	// Max creations (default Rate*Duration) and Duration (default 5
	// minutes): the load stops at the first bound reached, or at Stop.
	Max      int
	Duration time.Duration
	// RequestTimeout bounds one creation (default 15 s: Kueue's webhooks
	// have the API server's default 10 s timeout).
	RequestTimeout time.Duration
}

// Load creates LoadJob in LoadNamespace with server-side dry run (the API
// server runs authentication, admission with both of Kueue's Job webhooks
// and validation, and stores nothing, so the cluster does not fill with
// Jobs and Kueue's controllers stay idle) at a steady rate, at most 64 at
// once (realcluster.Pace), from its own client so the test's client is not throttled.
type Load struct {
	opts   LoadOptions
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	calls []Call
}

// StartLoad starts a load; stop it with Stop.
func StartLoad(ctx context.Context, c *cluster.Cluster, opts LoadOptions) (*Load, error) {
	if opts.Rate == 0 {
		opts.Rate = 20
	}
	if opts.Duration == 0 {
		opts.Duration = 5 * time.Minute
	}
	if opts.Max == 0 {
		opts.Max = int(opts.Rate * opts.Duration.Seconds())
	}
	if opts.RequestTimeout == 0 {
		opts.RequestTimeout = 15 * time.Second
	}
	cfg := rest.CopyConfig(c.Config)
	cfg.QPS, cfg.Burst = float32(opts.Rate*2+10), int(opts.Rate*2+10)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kueuecluster: load client: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	l := &Load{opts: opts, cancel: cancel, done: make(chan struct{})}
	go l.run(ctx, cs)
	return l, nil
}

func (l *Load) run(ctx context.Context, cs kubernetes.Interface) {
	defer close(l.done)
	job := LoadJob(LoadNamespace)
	realcluster.Pace(ctx, l.opts.Rate, l.opts.Max, l.opts.Duration, func() {
		// A request that was sent is answered and counted, even after
		// Stop.
		rctx, cancel := context.WithTimeout(context.Background(), l.opts.RequestTimeout)
		defer cancel()
		began := time.Now()
		got, err := cs.BatchV1().Jobs(LoadNamespace).Create(rctx, job.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		call := Call{Sent: began, Took: time.Since(began)}
		if err != nil {
			call.Err = strings.TrimSpace(err.Error())
		} else {
			call.Suspended = got.Spec.Suspend != nil && *got.Spec.Suspend
		}
		l.mu.Lock()
		l.calls = append(l.calls, call)
		l.mu.Unlock()
	})
}

// Stop stops sending, waits for the requests in flight and returns every
// call in the order sent.
func (l *Load) Stop() []Call {
	l.cancel()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.calls)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Sent.Before(out[j].Sent) })
	return out
}

// Summary counts the calls of a time window.
type Summary struct {
	// Calls made, Failed with any error, Bypassed (created without Kueue's
	// mutation: before its webhook configuration existed).
	Calls, Failed, Bypassed int
	// First and Last failure, by the time the call was sent, relative to
	// the scenario's start.
	First, Last time.Duration
	// Errors are the distinct messages with their counts.
	Errors map[string]int
}

// Summarize counts the calls sent in [from, to) (a zero to: no end), with
// times relative to start.
func Summarize(calls []Call, start, from, to time.Time) Summary {
	s := Summary{Errors: map[string]int{}}
	for _, c := range calls {
		if c.Sent.Before(from) || (!to.IsZero() && !c.Sent.Before(to)) {
			continue
		}
		s.Calls++
		if c.Err == "" {
			if !c.Suspended {
				s.Bypassed++
			}
			continue
		}
		at := c.Sent.Sub(start)
		if s.Failed == 0 {
			s.First = at
		}
		s.Failed++
		s.Last = at
		s.Errors[c.Err]++
	}
	return s
}

// Messages returns the distinct messages, most frequent first.
func (s Summary) Messages() []string {
	msgs := make([]string, 0, len(s.Errors))
	for m := range s.Errors {
		msgs = append(msgs, m)
	}
	sort.Slice(msgs, func(i, j int) bool {
		if s.Errors[msgs[i]] != s.Errors[msgs[j]] {
			return s.Errors[msgs[i]] > s.Errors[msgs[j]]
		}
		return msgs[i] < msgs[j]
	})
	return msgs
}

// Window is "a–b s" (first to last failure), or "-" without failures.
func (s Summary) Window() string {
	if s.Failed == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f–%.1f s", s.First.Seconds(), s.Last.Seconds())
}

// String is a plain-text summary with every message.
func (s Summary) String() string {
	b := fmt.Sprintf("%d failed of %d calls (%d bypassed), window %s", s.Failed, s.Calls, s.Bypassed, s.Window())
	for _, m := range s.Messages() {
		b += fmt.Sprintf("\n  %d× %s", s.Errors[m], m)
	}
	return b
}
