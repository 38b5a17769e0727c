package watch

import (
	"context"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// eventComponent is the source.component of the watch's Events.
const eventComponent = "kadmit-watch"

// maxSeedEvents bounds the Events read when taking the lead.
const maxSeedEvents = 500

// seed fills the dedup state from the Warning Events this watch (any
// replica) wrote within the repeat period, so that a new leader does not
// repeat the Warnings its predecessor sent an instant ago; a finding seeded
// so that is gone at the first evaluation gets its Resolved Event. One
// bounded List in namespace default; if it is refused (the watch's Role
// lacks list on events) or fails, nothing is seeded and the new leader
// sends the Warnings again.
func (e *events) seed(ctx context.Context, list func(context.Context, metav1.ListOptions) (*corev1.EventList, error), now time.Time) {
	l, err := list(ctx, metav1.ListOptions{Limit: maxSeedEvents, FieldSelector: fields.Set{"source": eventComponent, "type": corev1.EventTypeWarning}.String()})
	if err != nil {
		e.log.Debug("no seed of the Event dedup from earlier Events", "error", err)
		return
	}
	for _, ev := range l.Items {
		last := ev.LastTimestamp.Time
		if last.IsZero() {
			last = ev.EventTime.Time
		}
		if now.Sub(last) >= e.repeat || ev.InvolvedObject.Name == "" {
			continue
		}
		subject, _, ok := strings.Cut(ev.Message, ": ")
		if !ok {
			continue
		}
		k := eventKey{w: wkey{Kind: ev.InvolvedObject.Kind, Configuration: ev.InvolvedObject.Name}, id: ev.Reason}
		if hook, isHook := strings.CutPrefix(subject, "webhook "); isHook {
			k.w.Webhook = hook
		} else if subject != ev.InvolvedObject.Kind+" "+ev.InvolvedObject.Name {
			continue
		}
		if st := e.active[k]; st == nil || st.last.Before(last) {
			e.active[k] = &eventState{uid: ev.InvolvedObject.UID, emitted: true, last: last, message: ev.Message}
		}
	}
}
