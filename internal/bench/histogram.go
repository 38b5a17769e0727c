package bench

import (
	"math"
	"math/bits"
	"time"
)

// Histogram layout: values below 2^subBits ns get a bucket each; above, each
// power of two is split into 2^subBits equal buckets, so a bucket is at most
// 1/128 of its values wide and its midpoint is within 0.4% of any of them.
// Values are clamped to maxExp (2^40 ns, about 18 minutes: longer than any
// request can last).
const (
	subBits   = 7
	subCount  = 1 << subBits
	maxExp    = 40
	numBucket = (maxExp - subBits + 1) * subCount
)

// histogram records latencies in nanoseconds in a fixed 35 KiB of log-linear
// buckets. Not safe for concurrent use: each worker has its own, merged at the
// end.
type histogram struct {
	counts   [numBucket]uint64
	n        uint64
	sum      float64 // ns, for the mean
	min, max int64   // ns, exact
}

func bucketOf(v int64) int {
	if v < 0 {
		v = 0
	}
	if v >= 1<<maxExp {
		v = 1<<maxExp - 1
	}
	if v < subCount {
		return int(v)
	}
	e := bits.Len64(uint64(v)) - 1 // subBits <= e < maxExp
	mant := v >> (e - subBits)     // in [subCount, 2*subCount)
	return (e-subBits+1)*subCount + int(mant-subCount)
}

// bucketRange returns the smallest value in bucket i and the bucket's width.
func bucketRange(i int) (lo, width int64) {
	if i < subCount {
		return int64(i), 1
	}
	e := i/subCount + subBits - 1
	mant := int64(i%subCount + subCount)
	return mant << (e - subBits), 1 << (e - subBits)
}

func (h *histogram) record(d time.Duration) {
	v := int64(d)
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if h.n == 0 || v > h.max {
		h.max = v
	}
	h.counts[bucketOf(v)]++
	h.n++
	h.sum += float64(v)
}

func (h *histogram) merge(o *histogram) {
	if o.n == 0 {
		return
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if h.n == 0 || o.max > h.max {
		h.max = o.max
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
}

// quantile returns the value at quantile q (0..1) by the nearest-rank method:
// the smallest recorded value with at least q·n values at or below it, as its
// bucket's midpoint clamped to [min, max]. It is within 0.4% of the exact
// value, and exact for q=1 and values below 128 ns. 0 when empty.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	if rank >= h.n {
		return time.Duration(h.max)
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, w := bucketRange(i)
			v := lo + (w-1)/2
			return time.Duration(min(max(v, h.min), h.max))
		}
	}
	return time.Duration(h.max)
}

func (h *histogram) mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// bin is one bar of a displayed histogram: the count of latencies in [Lo, Hi).
type bin struct {
	Lo, Hi time.Duration
	Count  uint64
}

// bins regroups the fine buckets into at most n bars with log-spaced edges
// from min to max (so a long tail stays visible). Each fine bucket goes whole
// to the bar holding its midpoint. Empty when nothing was recorded.
func (h *histogram) bins(n int) []bin {
	if h.n == 0 || n < 1 {
		return nil
	}
	lo, hi := float64(max(h.min, 1)), float64(max(h.max, 1))
	if hi <= lo*1.0001 {
		return []bin{{Lo: time.Duration(h.min), Hi: time.Duration(h.max), Count: h.n}}
	}
	ratio := math.Log(hi / lo)
	out := make([]bin, n)
	for j := range out {
		out[j].Lo = time.Duration(lo * math.Exp(ratio*float64(j)/float64(n)))
		out[j].Hi = time.Duration(lo * math.Exp(ratio*float64(j+1)/float64(n)))
	}
	out[0].Lo, out[n-1].Hi = time.Duration(h.min), time.Duration(h.max)
	for i, c := range h.counts {
		if c == 0 {
			continue
		}
		b0, w := bucketRange(i)
		mid := float64(min(max(b0+(w-1)/2, h.min), h.max))
		j := int(math.Floor(math.Log(max(mid, 1)/lo) / ratio * float64(n)))
		out[min(max(j, 0), n-1)].Count += c
	}
	return out
}
