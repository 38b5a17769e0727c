package realcluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kadmit/kadmit/test/cluster"
)

// Event is one observed change, stamped when this process saw it.
type Event struct {
	At   time.Time
	What string
}

func (e Event) String() string { return e.At.UTC().Format("15:04:05.000") + " " + e.What }

// Timeline records, as this process observes them, the lifecycle of the
// pods matching a selector (created, scheduled, Ready or not, deletion
// requested, gone) and the ready addresses of a Service's EndpointSlices:
// what to line failures up against.
type Timeline struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	events []Event
	max    int
}

// StartTimeline watches pods matching selector and the EndpointSlices of
// service in namespace (service empty: pods only) until Stop or ctx ends,
// keeping at most 5,000 events.
func StartTimeline(ctx context.Context, c *cluster.Cluster, namespace, selector, service string) *Timeline {
	ctx, cancel := context.WithCancel(ctx)
	tl := &Timeline{cancel: cancel, max: 5000}
	tl.wg.Add(1)
	go func() {
		defer tl.wg.Done()
		WatchLoop(ctx, func(ctx context.Context) (watch.Interface, error) {
			return c.Client.CoreV1().Pods(namespace).Watch(ctx, metav1.ListOptions{LabelSelector: selector})
		}, tl.pod())
	}()
	if service != "" {
		tl.wg.Add(1)
		go func() {
			defer tl.wg.Done()
			WatchLoop(ctx, func(ctx context.Context) (watch.Interface, error) {
				return c.Client.DiscoveryV1().EndpointSlices(namespace).Watch(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
			}, tl.slice())
		}()
	}
	return tl
}

// Add records an event now (e.g. "rollout restart").
func (tl *Timeline) Add(format string, args ...any) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if len(tl.events) < tl.max {
		tl.events = append(tl.events, Event{At: time.Now(), What: fmt.Sprintf(format, args...)})
	}
}

// Stop ends the watches.
func (tl *Timeline) Stop() {
	tl.cancel()
	tl.wg.Wait()
}

// Events returns every event so far in order.
func (tl *Timeline) Events() []Event {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return slices.Clone(tl.events)
}

// Around returns the events within d of t.
func (tl *Timeline) Around(t time.Time, d time.Duration) []Event {
	var out []Event
	for _, e := range tl.Events() {
		if e.At.After(t.Add(-d)) && e.At.Before(t.Add(d)) {
			out = append(out, e)
		}
	}
	return out
}

// WatchLoop reopens a watch until ctx ends (a watch the API server closes,
// or one that fails to open, is retried a second later), handing every
// event to handle.
func WatchLoop(ctx context.Context, open func(context.Context) (watch.Interface, error), handle func(watch.Event)) {
	for ctx.Err() == nil {
		w, err := open(ctx)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		for ev := range w.ResultChan() {
			handle(ev)
		}
		w.Stop()
	}
}

func (tl *Timeline) pod() func(watch.Event) {
	type state struct {
		node     string
		ready    bool
		deleting bool
	}
	seen := map[string]*state{}
	return func(ev watch.Event) {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok {
			return
		}
		s := seen[p.Name]
		if s == nil {
			s = &state{}
			seen[p.Name] = s
			tl.Add("pod %s seen (%s)", p.Name, ev.Type)
		}
		if ev.Type == watch.Deleted {
			tl.Add("pod %s gone", p.Name)
			delete(seen, p.Name)
			return
		}
		if p.Spec.NodeName != "" && s.node == "" {
			s.node = p.Spec.NodeName
			tl.Add("pod %s on %s", p.Name, p.Spec.NodeName)
		}
		ready := false
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		if ready != s.ready {
			s.ready = ready
			tl.Add("pod %s Ready=%v (%s)", p.Name, ready, p.Status.PodIP)
		}
		if p.DeletionTimestamp != nil && !s.deleting {
			s.deleting = true
			grace := int64(0)
			if p.DeletionGracePeriodSeconds != nil {
				grace = *p.DeletionGracePeriodSeconds
			}
			tl.Add("pod %s deletion requested (grace %ds)", p.Name, grace)
		}
	}
}

func (tl *Timeline) slice() func(watch.Event) {
	last := map[string]string{}
	return func(ev watch.Event) {
		sl, ok := ev.Object.(*discoveryv1.EndpointSlice)
		if !ok {
			return
		}
		var ready, serving []string
		for _, ep := range sl.Endpoints {
			r := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			for _, a := range ep.Addresses {
				if r {
					ready = append(ready, a)
				} else if ep.Conditions.Serving != nil && *ep.Conditions.Serving {
					serving = append(serving, a+"(terminating)")
				}
			}
		}
		slices.Sort(ready)
		slices.Sort(serving)
		now := "ready [" + strings.Join(ready, " ") + "] serving-only [" + strings.Join(serving, " ") + "]"
		if ev.Type == watch.Deleted {
			now = "deleted"
		}
		if last[sl.Name] != now {
			last[sl.Name] = now
			tl.Add("endpointslice %s: %s", sl.Name, now)
		}
	}
}

// LogLines returns the lines of a component's log (a klog file such as
// c.APIServerLog()) that contain substr and are stamped between from and
// to (klog stamps carry no year: this year is assumed, in UTC). At most
// max lines are returned, the first ones.
func LogLines(path, substr string, from, to time.Time, max int) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("realcluster: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	year := time.Now().UTC().Year()
	for sc.Scan() && len(out) < max {
		line := sc.Text()
		if !strings.Contains(line, substr) || len(line) < 21 {
			continue
		}
		// klog: Lmmdd hh:mm:ss.uuuuuu
		ts, err := time.Parse("0102 15:04:05.000000", line[1:21])
		if err != nil {
			continue
		}
		ts = ts.AddDate(year, 0, 0)
		if ts.Before(from) || ts.After(to) {
			continue
		}
		out = append(out, line)
	}
	return out, sc.Err()
}

// WatchWebhookConfigurations adds to the timeline every change of the
// MutatingWebhookConfiguration and ValidatingWebhookConfiguration called
// name (created, caBundle or webhooks changed, deleted), until Stop.
func (tl *Timeline) WatchWebhookConfigurations(ctx context.Context, c *cluster.Cluster, name string) {
	ctx, cancel := context.WithCancel(ctx)
	prev := tl.cancel
	tl.cancel = func() { cancel(); prev() }
	sel := metav1.ListOptions{FieldSelector: "metadata.name=" + name}
	reg := c.Client.AdmissionregistrationV1()
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		tl.wg.Add(1)
		go func() {
			defer tl.wg.Done()
			last := ""
			WatchLoop(ctx, func(ctx context.Context) (watch.Interface, error) {
				if kind == "MutatingWebhookConfiguration" {
					return reg.MutatingWebhookConfigurations().Watch(ctx, sel)
				}
				return reg.ValidatingWebhookConfigurations().Watch(ctx, sel)
			}, func(ev watch.Event) {
				var hooks, bundle int
				switch o := ev.Object.(type) {
				case *admissionregistrationv1.MutatingWebhookConfiguration:
					hooks = len(o.Webhooks)
					for _, w := range o.Webhooks {
						bundle = max(bundle, len(w.ClientConfig.CABundle))
					}
				case *admissionregistrationv1.ValidatingWebhookConfiguration:
					hooks = len(o.Webhooks)
					for _, w := range o.Webhooks {
						bundle = max(bundle, len(w.ClientConfig.CABundle))
					}
				default:
					return
				}
				now := fmt.Sprintf("%d webhooks, caBundle %d bytes", hooks, bundle)
				if ev.Type == watch.Deleted {
					now = "deleted"
				}
				if now != last {
					last = now
					tl.Add("%s %s: %s", kind, name, now)
				}
			})
		}()
	}
}
