// Package gcpace keeps the Go garbage collector's heap goal at or above a
// floor, so that a server whose live heap is small does not collect many
// times a second.
//
// Why: the runtime sets the next heap goal to the live heap times
// (1 + GOGC/100), with a 4 MiB minimum. kadmit's live heap is a few MiB
// (certificates, policies, caches) while every review allocates tens of
// KiB, so at 10,000 reviews/s the collector ran about 40 times a second and
// took 10-20% of the CPU; worse, each cycle costs more with more cores (the
// idle Ps run mark workers, stop-the-world phases and preemption signals
// reach every P), which made CPU per review grow with GOMAXPROCS. A floor of
// a few tens of MiB divides the number of cycles by the same factor.
//
// The floor never overrides the memory limit: GOMEMLIMIT (runtime/debug
// SetMemoryLimit) still makes the collector run as the heap nears it, and
// Start lowers a floor above half the limit to half the limit, keeping room
// for the heap to grow between collections under load. When the live heap
// is above the floor, GOGC applies unchanged.
//
// This is the technique of Uber's GOGC tuner ("How We Saved 70K Cores
// Across 30 Mission-Critical Services", 2021) and of the heap ballasts it
// replaced; Go itself has no minimum heap (golang/go#23044 and the memory
// target of golang/go#44309 were closed without one; GOMEMLIMIT bounds the
// heap from above only).
package gcpace

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
)

// DefaultFloor is kadmit serve's default heap floor: 64 MiB. At the chart's
// GOMEMLIMIT of 200 MiB this leaves 136 MiB for bursts, and it cuts the
// collections of a 10,000 reviews/s load about eightfold (docs/performance.md).
const DefaultFloor int64 = 64 << 20

// maxPercent bounds the GOGC value Start sets: with a live heap of 64 KiB
// and the default floor the exact value would be 100,000.
const maxPercent = 10000

// liveMetric is the heap marked live by the last collection (Go 1.21+).
const liveMetric = "/gc/heap/live:bytes"

// Pacer is a running floor; Stop ends it and restores GOGC.
type Pacer struct {
	floor   int64
	base    int // GOGC from the environment, or 100
	stopped atomic.Bool

	mu      sync.Mutex
	percent int // the GOGC value last set
	cycles  uint64
}

// Start keeps the heap goal at or above floor bytes from the next
// collection on, adjusting GOGC (debug.SetGCPercent) after every
// collection: to base when live×(1+base/100) already reaches floor, else
// to the percentage that makes the goal floor (at most 10,000).
//
// It returns nil, doing nothing, when floor <= 0 or GOGC=off is set in the
// environment (the user asked for no proportional collection at all). A
// floor above half of the memory limit (debug.SetMemoryLimit, GOMEMLIMIT)
// is lowered to half of it. Start must be called at most once per process
// at a time: two Pacers would overwrite each other's GOGC.
func Start(floor int64) *Pacer {
	base := 100
	if v, ok := os.LookupEnv("GOGC"); ok {
		if v == "off" {
			return nil
		}
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			base = n
		}
	}
	if limit := debug.SetMemoryLimit(-1); limit < math.MaxInt64 && floor > limit/2 {
		floor = limit / 2
	}
	if floor <= 0 {
		return nil
	}
	p := &Pacer{floor: floor, base: base, percent: base}
	p.tune()
	p.arm()
	return p
}

// Floor is the floor in bytes after Start's adjustment to the memory limit.
func (p *Pacer) Floor() int64 { return p.floor }

// Percent is the GOGC value set after the last collection.
func (p *Pacer) Percent() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.percent
}

// Cycles is how many collections the Pacer has seen.
func (p *Pacer) Cycles() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cycles
}

// Stop ends the Pacer and restores GOGC to its base. A nil Pacer is a
// no-op.
func (p *Pacer) Stop() {
	if p == nil || p.stopped.Swap(true) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	debug.SetGCPercent(p.base)
	p.percent = p.base
}

// sentinel is garbage from birth: its finalizer runs once per collection,
// on the runtime's finalizer goroutine, and arms the next one. It holds a
// pointer so it is never a tiny allocation batched with other objects,
// whose finalizer could then wait for its neighbours to die too.
type sentinel struct {
	p *Pacer
	_ [16]byte
}

func (p *Pacer) arm() {
	runtime.SetFinalizer(&sentinel{p: p}, func(s *sentinel) {
		if s.p.stopped.Load() {
			return
		}
		s.p.tune()
		s.p.arm()
	})
}

// tune sets GOGC from the live heap of the last collection.
func (p *Pacer) tune() {
	sample := []metrics.Sample{{Name: liveMetric}}
	metrics.Read(sample)
	var live uint64
	if sample[0].Value.Kind() == metrics.KindUint64 {
		live = sample[0].Value.Uint64()
	}
	want := percentFor(live, p.floor, p.base)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cycles++
	if p.stopped.Load() {
		return
	}
	// SetGCPercent takes the heap lock and recomputes the pacer; skip it
	// while the value moves by less than a tenth.
	if d := want - p.percent; d != 0 && (want == p.base || d*10 > p.percent || -d*10 > p.percent) {
		debug.SetGCPercent(want)
		p.percent = want
	}
}

// percentFor is the GOGC that makes live×(1+percent/100) reach floor, at
// least base and at most maxPercent. A live heap of 0 (no collection yet)
// counts as 1 MiB.
func percentFor(live uint64, floor int64, base int) int {
	if live == 0 {
		live = 1 << 20
	}
	if int64(live) >= floor {
		return base
	}
	pct := (uint64(floor) - live) * 100 / live
	switch {
	case pct <= uint64(base):
		return base
	case pct >= maxPercent:
		return maxPercent
	}
	return int(pct)
}
