package jsonedit

import "github.com/kadmit/kadmit/internal/jsonedit/jsonscan"

// The envelope decoder's scan of request.object (ScanIndexed) walks every
// byte of the object once. Without a record of what it found, the first Doc
// to read spec.tolerations scans spec again, containers and volumes
// included, and the first to read metadata.labels scans metadata again:
// for a 4.6 KB Deployment pod that is more bytes than the envelope scan
// itself. extents keeps, from that one scan, where the containers just
// below the top-level members end, so that locating a member later skips
// a nested object or array in one lookup instead of scanning it.

// maxExtents bounds the containers an Index records: a Deployment's pod has
// about thirty at extentLevels (labels, annotations, ownerReferences and
// their elements, containers, tolerations, volumes and theirs, and each
// container's fields). Past it, the rest are not recorded and are scanned
// when located, as without an Index; an Index stays one size whatever the
// input.
const maxExtents = 64

// extentLevels is how far below the indexed object's top-level members
// containers are recorded: level 2 is a member of spec or metadata
// (spec.containers), 3 an element of it (a container), 4 a member of that
// (a container's resources). Deeper values (managedFields' fieldsV1, env
// values) are rarely located by a policy.
const extentLevels = 4

// extents is where containers of an Index's bytes end, by where they
// start: start is increasing (the scan records a container before the ones
// it holds). Offsets are those of the bytes the Index is bound to, as
// int32: an object larger than 2 GiB records none (the request body limit
// is far below).
type extents struct {
	n          int
	start, end [maxExtents]int32
}

// scan is jsonscan.ScanValue for the value at d[i] (depth is its nesting
// depth, level its level below the indexed object: 1 for a top-level
// member's value), recording in x each container at levels 2 to
// extentLevels while there is room, offsets relative to base (where the
// indexed object starts in d). It returns what ScanValue returns.
func (x *extents) scan(d []byte, i, depth, level, base int) int {
	if i >= len(d) || level > extentLevels || (d[i] != '{' && d[i] != '[') {
		return jsonscan.ScanValue(d, i, depth)
	}
	slot := -1
	if level >= 2 && x.n < maxExtents && len(d)-base <= 1<<31-1 {
		slot = x.n
		x.n++
		x.start[slot] = int32(i - base)
	}
	var end int
	if d[i] == '{' {
		end = jsonscan.Members(d, i, depth, func(_, _, vs int) int { return x.scan(d, vs, depth+1, level+1, base) })
	} else {
		end = jsonscan.Elements(d, i, depth, func(vs int) int { return x.scan(d, vs, depth+1, level+1, base) })
	}
	if slot >= 0 {
		x.end[slot] = int32(end - base) // end < 0 fails the whole scan: x is dropped
	}
	return end
}

// skipper skips a member's or element's value while a container is
// located: recording the containers it holds into x (ScanIndexed), or
// looking them up in x (a Doc over an Index's bytes), or, with a nil x,
// scanning it.
type skipper struct {
	x      *extents
	record bool
	base   int // record: where the indexed object starts
}

// value returns the index past the value at d[i] (depth is its nesting
// depth), or -1 when it is not valid JSON.
func (k skipper) value(d []byte, i, depth int) int {
	if k.record {
		return k.x.scan(d, i, depth, 1, k.base)
	}
	return k.x.skip(d, i, depth)
}

// skip returns the index past the valid JSON value at d[i], from x when x
// (which may be nil) recorded the container starting there, else by
// scanning it.
func (x *extents) skip(d []byte, i, depth int) int {
	if x != nil && x.n > 0 && (d[i] == '{' || d[i] == '[') {
		lo, hi := 0, x.n
		for lo < hi {
			m := int(uint(lo+hi) >> 1)
			if int(x.start[m]) < i {
				lo = m + 1
			} else {
				hi = m
			}
		}
		if lo < x.n && int(x.start[lo]) == i {
			return int(x.end[lo])
		}
	}
	return jsonscan.ScanValue(d, i, depth)
}

// moved returns x as it is in a document made by replacing its bytes
// [s, e) with others, delta bytes longer: a container before the edit
// stays, one after it shifts, one holding it grows, and one inside it (or
// overlapping it) is dropped. x may be nil (the result is empty).
func (x *extents) moved(s, e, delta int) (out extents) {
	if x == nil {
		return out
	}
	for k := 0; k < x.n; k++ {
		a, b := int(x.start[k]), int(x.end[k])
		switch {
		case b <= s:
		case a >= e:
			a, b = a+delta, b+delta
		case a < s && b >= e:
			b += delta
		default:
			continue
		}
		if b > 1<<31-1 {
			return extents{}
		}
		out.start[out.n], out.end[out.n] = int32(a), int32(b)
		out.n++
	}
	return out
}
