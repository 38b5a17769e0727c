package watch

import (
	"sync"

	"github.com/kadmit/kadmit/internal/doctor"
)

// extraFindings holds findings made outside Diagnose, by the slower
// loops (cert-manager injection sources, probes), each source replacing
// its own set; evaluations add them to the webhooks' findings. Bounded by
// the tracked webhooks, since the sources only look at those.
type extraFindings struct {
	mu sync.Mutex
	by map[string]map[wkey][]doctor.Finding // source -> webhook -> findings
}

func newExtraFindings() *extraFindings {
	return &extraFindings{by: map[string]map[wkey][]doctor.Finding{}}
}

// set replaces source's findings.
func (x *extraFindings) set(source string, fs map[wkey][]doctor.Finding) {
	x.mu.Lock()
	x.by[source] = fs
	x.mu.Unlock()
}

// snapshot merges every source's findings by webhook.
func (x *extraFindings) snapshot() map[wkey][]doctor.Finding {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[wkey][]doctor.Finding{}
	for _, src := range x.by {
		for k, fs := range src {
			out[k] = append(out[k], fs...)
		}
	}
	return out
}
