package admission

import (
	"slices"

	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/jsonedit/jsonscan"
)

// Prune and DecodeFields let a policy hand the decoder only the few
// hundred bytes of an object it reads; they walk the rest with the scanner
// of package jsonscan, through its one member loop (Members). Keys are
// matched by the API server's rule (jsonedit.Unmarshal: case-sensitive,
// exact names). FuzzScanValid checks them against jsonedit.Unmarshal of the
// whole document.

// Keep names the members of a JSON object that Prune keeps. A nil Keep keeps
// a whole value; a non-nil one keeps only the object members whose key
// is one of its keys and prunes each of them with the Keep it maps to.
type Keep map[string]Keep

// Prune returns a copy of the JSON document d with, at every object level
// keep describes, only the members keep names: a policy that reads a few
// fields of a 4.6 KB pod then decodes a few hundred bytes. Decoding the
// result with jsonedit.Unmarshal into a struct that has only fields named
// by keep yields the same values and the same type errors as decoding d
// itself, because Prune keeps every member that decoder could match to such
// a field: keys are compared exactly (the decoder matches names
// case-sensitively), a key with an escape sequence is always kept (it
// might unescape to a kept name), and duplicate keys stay in order. A value
// that keep expects to be an object but is not is kept whole. Prune returns
// an error (jsonscan.ErrSyntax) when d is not valid JSON (as json.Valid);
// callers then decode d itself to report the decoder's message.
func Prune(d []byte, keep Keep) ([]byte, error) {
	out, _, err := pruneDoc(d, keep)
	return out, err
}

// pruneDoc is Prune that also reports whether the kept members are
// canonical: every key without escapes and at most once per object.
func pruneDoc(d []byte, keep Keep) ([]byte, bool, error) {
	p := pruner{d: d, out: make([]byte, 0, 256), canonical: true}
	end := p.prune(jsonscan.SkipSpace(d, 0), keep, 0)
	if end < 0 || jsonscan.SkipSpace(d, end) != len(d) {
		return nil, false, jsonscan.ErrSyntax
	}
	return p.out, p.canonical, nil
}

type pruner struct {
	d, out    []byte
	canonical bool
	sub       Keep // the Keep of the member kept last
}

// kept reports whether the member whose key is d[ks:ke] (quotes included)
// is kept; if so it appends the key and ':' to p.out (after a comma unless
// *first), notes whether the key is canonical, and sets p.sub to the Keep
// of its value.
func (p *pruner) kept(ks, ke int, keep Keep, seen *[]string, first *bool) bool {
	name, sub, ok := matchKey(p.d[ks+1:ke-1], keep)
	if !ok {
		return false
	}
	if name == "" || slices.Contains(*seen, name) {
		p.canonical = false
	}
	*seen = append(*seen, name)
	if !*first {
		p.out = append(p.out, ',')
	}
	*first = false
	p.out = append(p.out, p.d[ks:ke]...)
	p.out = append(p.out, ':')
	p.sub = sub
	return true
}

// pruneIndexed is pruneDoc for the object d whose top-level members ix
// located (ix bound to d): it prunes the kept members' values without
// scanning the others again. d is valid JSON (an Index is only built over
// valid JSON). ok is false when ix is not bound to d.
func pruneIndexed(d []byte, ix *jsonedit.Index, keep Keep) (out []byte, canonical, ok bool) {
	n, ok := ix.Len(d)
	if !ok || keep == nil {
		return nil, false, false
	}
	p := pruner{d: d, out: make([]byte, 0, 256), canonical: true}
	p.out = append(p.out, '{')
	first := true
	var seen []string
	for k := 0; k < n; k++ {
		ks, ke, vs, _ := ix.Member(k)
		if p.kept(ks, ke, keep, &seen, &first) && p.prune(vs, p.sub, 1) < 0 {
			return nil, false, false
		}
	}
	return append(p.out, '}'), p.canonical, true
}

// prune appends the pruned value at d[i] (depth is its nesting depth) to
// p.out and returns the index past the value, or -1 on a syntax error.
func (p *pruner) prune(i int, keep Keep, depth int) int {
	d := p.d
	if keep == nil || i >= len(d) || d[i] != '{' {
		end := jsonscan.ScanValue(d, i, depth)
		if end < 0 {
			return -1
		}
		p.out = append(p.out, d[i:end]...)
		return end
	}
	p.out = append(p.out, '{')
	first := true
	var seen []string // kept keys at this level, to spot duplicates
	end := jsonscan.Members(d, i, depth, func(ks, ke, vs int) int {
		if p.kept(ks, ke, keep, &seen, &first) {
			return p.prune(vs, p.sub, depth+1)
		}
		return jsonscan.ScanValue(d, vs, depth+1)
	})
	if end >= 0 {
		p.out = append(p.out, '}')
	}
	return end
}

// matchKey reports whether the raw (still escaped) key matches a key of
// keep as the decoder matches a struct field (exactly), with that key's
// name and sub-Keep. A key with escapes is kept whole, with name "": it
// might unescape to a kept name.
func matchKey(raw []byte, keep Keep) (string, Keep, bool) {
	for _, c := range raw {
		if c == '\\' {
			return "", nil, true
		}
	}
	if sub, ok := keep[string(raw)]; ok {
		return string(raw), sub, true
	}
	return "", nil, false
}

// DecodeFields decodes into v (a struct whose fields are only those keep
// names) the members of the JSON document raw that keep names:
// jsonedit.Unmarshal(Prune(raw, keep), v), so a policy that reads a pod's
// name never decodes its spec. Member names match as the API server
// matches them (case-sensitively). When raw is not valid JSON it returns
// jsonedit.Unmarshal(raw, v)'s error, so messages are the decoder's own.
//
// canonical reports that every member keep names appeared at most once and
// without escapes: what the API server always sends. A policy that builds
// a JSONPatch addressing the members it decoded by name needs that; without
// it, it must read and edit through a jsonedit.Doc instead.
func DecodeFields(raw []byte, keep Keep, v any) (canonical bool, err error) {
	return decodeFields(raw, nil, keep, v)
}

// DecodeObjectFields is DecodeFields(req.Object.Raw, keep, v), without
// scanning again the top-level members of the object keep does not name
// when DecodeReview located them (see ObjectDoc).
func (req *Request) DecodeObjectFields(keep Keep, v any) (canonical bool, err error) {
	return decodeFields(req.Object.Raw, req.objectIndex, keep, v)
}

func decodeFields(raw []byte, ix *jsonedit.Index, keep Keep, v any) (canonical bool, err error) {
	if pruned, canonical, ok := pruneIndexed(raw, ix, keep); ok {
		return canonical, jsonedit.Unmarshal(pruned, v)
	}
	pruned, canonical, err := pruneDoc(raw, keep)
	if err != nil {
		return false, jsonedit.Unmarshal(raw, v)
	}
	return canonical, jsonedit.Unmarshal(pruned, v)
}
