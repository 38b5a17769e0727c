package watchprobe

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// DefaultKeepEvents bounds the Events an EventRecorder keeps; later ones
// are counted (EventRecorder.Dropped), not kept.
const DefaultKeepEvents = 20000

// Event is one core/v1 Event as the test saw it arrive (or its count rise).
type Event struct {
	At                 time.Time
	Type, Reason       string
	Kind, Name         string // involvedObject
	Message, Namespace string
}

// EventRecorder keeps the Events written in a namespace (or every
// namespace) from its start, with the time the test saw each.
type EventRecorder struct {
	keep    int
	mu      sync.Mutex
	events  []Event
	counts  map[string]int32 // by namespace/name: last count seen
	dropped int
}

// StartEventRecorder records the Events of namespace ("" for every
// namespace; Events about cluster-scoped objects such as webhook
// configurations land in "default") until t ends, keeping at most keep
// (0: DefaultKeepEvents); it returns once its informer has listed.
func StartEventRecorder(t testing.TB, client kubernetes.Interface, namespace string, keep int) *EventRecorder {
	t.Helper()
	if keep <= 0 {
		keep = DefaultKeepEvents
	}
	r := &EventRecorder{keep: keep, counts: map[string]int32{}}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace))
	inf := f.Core().V1().Events().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    r.record,
		UpdateFunc: func(_, obj any) { r.record(obj) },
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	f.Start(stop)
	t.Cleanup(func() { close(stop); f.Shutdown() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("Event informer did not sync")
	}
	return r
}

func (r *EventRecorder) record(obj any) {
	ev, ok := obj.(*corev1.Event)
	if !ok {
		return
	}
	n := ev.Count
	if ev.Series != nil && ev.Series.Count > n {
		n = ev.Series.Count
	}
	key := ev.Namespace + "/" + ev.Name
	r.mu.Lock()
	defer r.mu.Unlock()
	prev, seen := r.counts[key]
	if seen && prev >= n {
		return
	}
	if len(r.events) >= r.keep {
		r.dropped++
		return
	}
	// counts holds at most one key per kept Event: bounded with them.
	r.counts[key] = n
	r.events = append(r.events, Event{At: time.Now(), Type: ev.Type, Reason: ev.Reason, Kind: ev.InvolvedObject.Kind,
		Name: ev.InvolvedObject.Name, Message: ev.Message, Namespace: ev.Namespace})
}

// Matching returns the Events seen from since on for which keep is true.
func (r *EventRecorder) Matching(since time.Time, keep func(Event) bool) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Event
	for _, ev := range r.events {
		if !ev.At.Before(since) && keep(ev) {
			out = append(out, ev)
		}
	}
	return out
}

// Dropped is the number of Events not kept past the bound.
func (r *EventRecorder) Dropped() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dropped
}

// OnConfig keeps the Events on webhook configuration name ("" for any
// configuration) of type typ and reason reason ("" for any).
func OnConfig(name, typ, reason string) func(Event) bool {
	return func(ev Event) bool {
		return (name == "" || ev.Name == name) && IsConfigKind(ev.Kind) &&
			(typ == "" || ev.Type == typ) && (reason == "" || ev.Reason == reason)
	}
}

// IsConfigKind reports whether kind is a webhook configuration's.
func IsConfigKind(kind string) bool {
	return kind == "ValidatingWebhookConfiguration" || kind == "MutatingWebhookConfiguration"
}

func (ev Event) String() string {
	return fmt.Sprintf("%s %s %s on %s/%s at %s: %s", ev.Type, ev.Reason, ev.Namespace, ev.Kind, ev.Name, ev.At.Format("15:04:05.000"), ev.Message)
}
