package admission

import (
	"encoding/json"
	"sync"
	"unicode/utf8"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/jsonedit/jsonscan"
)

// The AdmissionReview envelope is decoded here without reflection: one pass
// of the scanner (package jsonscan, through its one member loop, Members)
// over the body reads apiVersion, kind and every field of request
// (admissionv1.AdmissionRequest as of k8s.io/api v0.37.1,
// admission/v1/types.go), checks the syntax of everything else, and records
// where request.object's top-level members are (jsonedit.Index) on the way.
//
// The result must be the API server's decoder's into Review on every
// input: jsonedit.Unmarshal, i.e. sigs.k8s.io/json's case-sensitive
// UnmarshalCaseSensitivePreserveInts (see jsonedit's scan.go for the key
// rule and its source). The decoder therefore handles what the API server
// sends (each field once, under its exact name, with its own JSON type,
// null where the decoder treats null simply), skips members whose name is
// no field's exact name, and declines anything else, after which
// DecodeReview runs jsonedit.Unmarshal on the whole body, so that the
// answer and the error message are that decoder's own. It declines on:
//   - invalid JSON anywhere in the body, or a body that is not an object;
//   - a key with an escape (it might unescape to a field's name);
//   - a key that names a field of the table below the decoder does not
//     handle itself (the top-level "response", which Review has too);
//   - a second occurrence of an object-, array- or map-valued field
//     (the decoder merges into the first one, and null resets pointers,
//     slices and maps but not structs) or of request itself;
//   - a value of another JSON type than the field's (an
//     UnmarshalTypeError), and null elements in groups or extra values.
//
// Duplicates of string, boolean and RawExtension fields are decoded
// natively: the last one wins, and null leaves a string or RawExtension as
// it was (runtime.RawExtension.UnmarshalJSON ignores null) and sets dryRun
// to nil, as the decoder does. FuzzDecodeEnvelope and
// TestDecodeEnvelopeMatchesUnmarshal check all this against
// jsonedit.Unmarshal.

// decoded is everything the envelope decoder allocates for one review but
// the strings, the raw values and the extra map, in one allocation.
type decoded struct {
	review  Review
	req     Request
	reqKind metav1.GroupVersionKind
	reqRes  metav1.GroupVersionResource
	dryRun  bool
	groups  [4]string // userInfo.groups when there are at most 4
	index   jsonedit.Index
}

// envDecoder holds the scratch state of one decode; pooled.
type envDecoder struct {
	b     []byte
	blk   *decoded
	arena []byte    // every decoded string's bytes, made one string at the end
	refs  []strRef  // where each decoded string goes
	spans []span    // array elements being collected
	extra []extraKV // userInfo.extra's members, in order
	// hasExtra: userInfo.extra was an object (build the map, even empty).
	hasExtra bool
	// obj, old, opts: the last non-null value of object, oldObject and
	// options, as body offsets; {0, 0} when none.
	obj, old, opts [2]int
}

type span struct{ s, e int } // in arena

type strRef struct {
	dst *string
	span
}

type extraKV struct {
	key    span
	vs, ve int // elements in spans
	null   bool
}

// maxPooledDecoder keeps a decoder grown by a huge envelope (a user with
// thousands of groups) out of the pool.
const maxPooledDecoder = 64 << 10

var envDecoders = sync.Pool{New: func() any {
	return &envDecoder{arena: make([]byte, 0, 1024), refs: make([]strRef, 0, 32), spans: make([]span, 0, 16)}
}}

// decodeEnvelope decodes body as jsonedit.Unmarshal into Review would, or
// returns false when it cannot be sure to (see above). When request.object
// is an object with at most jsonedit.IndexMembers members, the Request's
// ObjectDoc starts from the index of them the scan built.
func decodeEnvelope(body []byte) (*decoded, bool) {
	d := envDecoders.Get().(*envDecoder)
	blk, ok := d.decode(body)
	if cap(d.arena) <= maxPooledDecoder && cap(d.refs) <= maxPooledDecoder/32 && cap(d.spans) <= maxPooledDecoder/16 &&
		cap(d.extra) <= maxPooledDecoder/64 {
		clear(d.refs[:cap(d.refs)]) // drop pointers into the review
		*d = envDecoder{arena: d.arena[:0], refs: d.refs[:0], spans: d.spans[:0], extra: d.extra[:0]}
		envDecoders.Put(d)
	}
	return blk, ok
}

func (d *envDecoder) decode(body []byte) (*decoded, bool) {
	d.b, d.blk = body, &decoded{}
	ix := &d.blk.index
	i := jsonscan.SkipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil, false
	}
	end := d.object(i, 0, func(key []byte, vs int) int {
		switch string(key) {
		case "apiVersion":
			return d.str(vs, &d.blk.review.APIVersion)
		case "kind":
			return d.str(vs, &d.blk.review.Kind)
		case "request":
			return d.request(vs, ix)
		}
		return d.unknown(key, vs, 1, reviewFields...)
	})
	if end < 0 || jsonscan.SkipSpace(body, end) != len(body) {
		return nil, false
	}
	return d.finish(), true
}

// Field bits, to spot a second occurrence of a field decoded in place.
const (
	seenRequest = 1 << iota
	seenKind
	seenResource
	seenRequestKind
	seenRequestResource
	seenUserInfo
	seenGroups
	seenExtra
)

func (d *envDecoder) request(vs int, ix *jsonedit.Index) int {
	b, blk := d.b, d.blk
	if blk.review.Request != nil || vs >= len(b) {
		return -1
	}
	if b[vs] != '{' {
		return -1 // null, or a type error: let the decoder say
	}
	r := &blk.req.AdmissionRequest
	blk.review.Request = r
	var seen uint
	once := func(bit uint) bool {
		ok := seen&bit == 0
		seen |= bit
		return ok
	}
	return d.object(vs, 1, func(key []byte, vs int) int {
		switch string(key) {
		case "uid":
			return d.str(vs, (*string)(&r.UID))
		case "kind":
			if !once(seenKind) {
				return -1
			}
			return d.gvk(vs, 2, &r.Kind)
		case "resource":
			if !once(seenResource) {
				return -1
			}
			return d.gvr(vs, 2, &r.Resource)
		case "subResource":
			return d.str(vs, &r.SubResource)
		case "requestKind":
			if !once(seenRequestKind) {
				return -1
			}
			if isNull(b, vs) {
				r.RequestKind = nil
				return vs + 4
			}
			r.RequestKind = &blk.reqKind
			return d.gvk(vs, 2, r.RequestKind)
		case "requestResource":
			if !once(seenRequestResource) {
				return -1
			}
			if isNull(b, vs) {
				r.RequestResource = nil
				return vs + 4
			}
			r.RequestResource = &blk.reqRes
			return d.gvr(vs, 2, r.RequestResource)
		case "requestSubResource":
			return d.str(vs, &r.RequestSubResource)
		case "name":
			return d.str(vs, &r.Name)
		case "namespace":
			return d.str(vs, &r.Namespace)
		case "operation":
			return d.str(vs, (*string)(&r.Operation))
		case "userInfo":
			if !once(seenUserInfo) {
				return -1
			}
			return d.userInfo(vs, &r.UserInfo)
		case "object":
			if vs < len(b) && b[vs] == '{' {
				return d.raw(vs, jsonedit.ScanIndexed(b, vs, 2, ix), &d.obj)
			}
			return d.raw(vs, jsonscan.ScanValue(b, vs, 2), &d.obj)
		case "oldObject":
			return d.raw(vs, jsonscan.ScanValue(b, vs, 2), &d.old)
		case "options":
			return d.raw(vs, jsonscan.ScanValue(b, vs, 2), &d.opts)
		case "dryRun":
			switch {
			case isNull(b, vs):
				r.DryRun = nil
				return vs + 4
			case hasLiteral(b, vs, "true"):
				blk.dryRun, r.DryRun = true, &blk.dryRun
				return vs + 4
			case hasLiteral(b, vs, "false"):
				blk.dryRun, r.DryRun = false, &blk.dryRun
				return vs + 5
			}
			return -1
		}
		return d.unknown(key, vs, 2, requestFields...)
	})
}

// The decoder's field table: the JSON field names of each type it reads by
// hand (k8s.io/api admission/v1 AdmissionReview and AdmissionRequest,
// apimachinery's GroupVersionKind and GroupVersionResource,
// authentication/v1 UserInfo). A key that is one of them but that the
// decoder's switch does not handle (see unknown) declines to the decoder;
// any other key is skipped, as the decoder skips a field its type does not
// have. So a field a k8s.io/api release adds must be listed here, or the
// fast path would drop it where the decoder keeps it:
// TestDecoderKnowsEveryField walks the types by reflection and fails then,
// and TestDecoderHandlesEveryField fills every field by reflection and
// fails when the fast path declines or differs.
var (
	reviewFields  = []string{"apiVersion", "kind", "request", "response"}
	requestFields = []string{"uid", "kind", "resource", "subResource", "requestKind", "requestResource",
		"requestSubResource", "name", "namespace", "operation", "userInfo", "object", "oldObject", "dryRun", "options"}
	gvkFields      = []string{"group", "version", "kind"}
	gvrFields      = []string{"group", "version", "resource"}
	userInfoFields = []string{"username", "uid", "groups", "extra"}
)

// decoderFields is the field table by JSON path from the review's root
// ("" is the AdmissionReview, "request.userInfo" the request's UserInfo):
// for every object the decoder reads by hand, the names it knows there.
// TestDecoderKnowsEveryField walks admissionv1.AdmissionReview by
// reflection and compares it with this table both ways.
var decoderFields = map[string][]string{
	"":                        reviewFields,
	"request":                 requestFields,
	"request.kind":            gvkFields,
	"request.requestKind":     gvkFields,
	"request.resource":        gvrFields,
	"request.requestResource": gvrFields,
	"request.userInfo":        userInfoFields,
}

// raw records the value d.b[vs:ve] of a RawExtension field in *dst unless
// it is null (RawExtension.UnmarshalJSON keeps the previous value then).
func (d *envDecoder) raw(vs, ve int, dst *[2]int) int {
	if ve >= 0 && !isNull(d.b, vs) {
		*dst = [2]int{vs, ve}
	}
	return ve
}

func (d *envDecoder) gvk(vs, depth int, v *metav1.GroupVersionKind) int {
	if isNull(d.b, vs) {
		return vs + 4 // null leaves a struct alone
	}
	if vs >= len(d.b) || d.b[vs] != '{' {
		return -1
	}
	return d.object(vs, depth, func(key []byte, vs int) int {
		switch string(key) {
		case "group":
			return d.str(vs, &v.Group)
		case "version":
			return d.str(vs, &v.Version)
		case "kind":
			return d.str(vs, &v.Kind)
		}
		return d.unknown(key, vs, depth+1, gvkFields...)
	})
}

func (d *envDecoder) gvr(vs, depth int, v *metav1.GroupVersionResource) int {
	if isNull(d.b, vs) {
		return vs + 4
	}
	if vs >= len(d.b) || d.b[vs] != '{' {
		return -1
	}
	return d.object(vs, depth, func(key []byte, vs int) int {
		switch string(key) {
		case "group":
			return d.str(vs, &v.Group)
		case "version":
			return d.str(vs, &v.Version)
		case "resource":
			return d.str(vs, &v.Resource)
		}
		return d.unknown(key, vs, depth+1, gvrFields...)
	})
}

func (d *envDecoder) userInfo(vs int, u *authenticationv1.UserInfo) int {
	b := d.b
	if isNull(b, vs) {
		return vs + 4
	}
	if vs >= len(b) || b[vs] != '{' {
		return -1
	}
	var seen uint
	return d.object(vs, 2, func(key []byte, vs int) int {
		switch string(key) {
		case "username":
			return d.str(vs, &u.Username)
		case "uid":
			return d.str(vs, &u.UID)
		case "groups":
			if seen&seenGroups != 0 {
				return -1
			}
			seen |= seenGroups
			if isNull(b, vs) {
				u.Groups = nil
				return vs + 4
			}
			first := len(d.spans)
			end := d.strings(vs, 3)
			if end < 0 {
				return -1
			}
			n := len(d.spans) - first
			if n <= len(d.blk.groups) {
				u.Groups = d.blk.groups[:n:n]
			} else {
				u.Groups = make([]string, n)
			}
			for k, sp := range d.spans[first:] {
				d.refs = append(d.refs, strRef{&u.Groups[k], sp})
			}
			d.spans = d.spans[:first]
			return end
		case "extra":
			if seen&seenExtra != 0 {
				return -1
			}
			seen |= seenExtra
			return d.extraMap(vs)
		}
		return d.unknown(key, vs, 3, userInfoFields...)
	})
}

// extraMap records userInfo.extra (a map of string arrays) for finish.
func (d *envDecoder) extraMap(vs int) int {
	b := d.b
	if isNull(b, vs) {
		return vs + 4 // the map stays nil
	}
	if vs >= len(b) || b[vs] != '{' {
		return -1
	}
	d.hasExtra = true
	return d.object(vs, 3, func(key []byte, vs int) int {
		// Map keys are any string, compared exactly: unescape the key.
		ks, ok := d.keySpan(key)
		if !ok {
			return -1
		}
		kv := extraKV{key: ks}
		if isNull(b, vs) {
			kv.null = true
			d.extra = append(d.extra, kv)
			return vs + 4
		}
		kv.vs = len(d.spans)
		end := d.strings(vs, 4)
		kv.ve = len(d.spans)
		d.extra = append(d.extra, kv)
		return end
	})
}

// strings appends to d.spans the elements of the array of strings at
// d.b[vs] (depth is its nesting depth) and returns the index past it; null
// elements and other types decline. The elements are walked by
// jsonscan.Elements.
func (d *envDecoder) strings(vs, depth int) int {
	return jsonscan.Elements(d.b, vs, depth, func(i int) int {
		sp, end := d.strSpan(i)
		if end >= 0 {
			d.spans = append(d.spans, sp)
		}
		return end
	})
}

// str decodes the string at d.b[vs] into *dst (at finish); null leaves
// *dst alone, as the decoder does for a string field.
func (d *envDecoder) str(vs int, dst *string) int {
	if isNull(d.b, vs) {
		return vs + 4
	}
	sp, end := d.strSpan(vs)
	if end >= 0 {
		d.refs = append(d.refs, strRef{dst, sp})
	}
	return end
}

// strSpan decodes the JSON string at d.b[i] into the arena, as
// encoding/json decodes it, and returns its span and the index past it;
// -1 when d.b[i] is not a valid string.
func (d *envDecoder) strSpan(i int) (span, int) {
	b := d.b
	if i >= len(b) || b[i] != '"' {
		return span{}, -1
	}
	j := i + 1
	for j < len(b) && b[j] >= 0x20 && b[j] < utf8.RuneSelf && b[j] != '"' && b[j] != '\\' {
		j++
	}
	if j < len(b) && b[j] == '"' {
		return d.appendArena(b[i+1 : j]), j + 1
	}
	// Escapes, non-ASCII or invalid input: encoding/json's unquoting
	// (sigs.k8s.io/json's is the same code; no key is matched here).
	end := jsonscan.ScanString(b, i)
	if end < 0 {
		return span{}, -1
	}
	if content := b[i+1 : end-1]; utf8.Valid(content) && !hasByte(content, '\\') {
		return d.appendArena(content), end
	}
	var s string
	if err := json.Unmarshal(b[i:end], &s); err != nil {
		return span{}, -1
	}
	sp := span{len(d.arena), len(d.arena) + len(s)}
	d.arena = append(d.arena, s...)
	return sp, end
}

// keySpan is strSpan for a raw key (the bytes between its quotes).
func (d *envDecoder) keySpan(key []byte) (span, bool) {
	if utf8.Valid(key) && !hasByte(key, '\\') {
		return d.appendArena(key), true
	}
	var s string
	q := make([]byte, 0, len(key)+2)
	q = append(append(append(q, '"'), key...), '"')
	if err := json.Unmarshal(q, &s); err != nil {
		return span{}, false
	}
	sp := span{len(d.arena), len(d.arena) + len(s)}
	d.arena = append(d.arena, s...)
	return sp, true
}

func (d *envDecoder) appendArena(v []byte) span {
	sp := span{len(d.arena), len(d.arena) + len(v)}
	d.arena = append(d.arena, v...)
	return sp
}

// unknown handles a member whose key is no field's name the caller's switch
// handles: a key with an escape, or one that is in fields (the type's
// field table: a field listed but not handled here), declines; any other
// is skipped after its value's syntax is checked (depth is the value's
// nesting depth), as the decoder, matching names case-sensitively, skips
// it.
func (d *envDecoder) unknown(key []byte, vs, depth int, fields ...string) int {
	if hasByte(key, '\\') {
		return -1
	}
	for _, f := range fields {
		if string(key) == f {
			return -1
		}
	}
	return jsonscan.ScanValue(d.b, vs, depth)
}

// object walks the members of the object at d.b[i] == '{' (depth is its
// nesting depth) with jsonscan.Members, calling member with each raw key
// (without quotes, still escaped) and the index of its value; member
// returns the index past the value, or -1 to decline. object returns the
// index past the object, or -1.
func (d *envDecoder) object(i, depth int, member func(key []byte, vs int) int) int {
	b := d.b
	return jsonscan.Members(b, i, depth, func(ks, ke, vs int) int {
		return member(b[ks+1:ke-1], vs)
	})
}

// finish makes the strings, the raw values and the extra map.
func (d *envDecoder) finish() *decoded {
	blk := d.blk
	if len(d.refs) > 0 || len(d.extra) > 0 {
		s := string(d.arena)
		for _, r := range d.refs {
			*r.dst = s[r.s:r.e]
		}
		if d.hasExtra {
			u := &blk.req.UserInfo
			u.Extra = make(map[string]authenticationv1.ExtraValue, len(d.extra))
			for _, kv := range d.extra {
				var v authenticationv1.ExtraValue
				if !kv.null {
					v = make(authenticationv1.ExtraValue, kv.ve-kv.vs)
					for k, sp := range d.spans[kv.vs:kv.ve] {
						v[k] = s[sp.s:sp.e]
					}
				}
				u.Extra[s[kv.key.s:kv.key.e]] = v
			}
		}
	} else if d.hasExtra {
		blk.req.UserInfo.Extra = map[string]authenticationv1.ExtraValue{}
	}
	n := (d.obj[1] - d.obj[0]) + (d.old[1] - d.old[0]) + (d.opts[1] - d.opts[0])
	if blk.review.Request == nil || n == 0 {
		return blk
	}
	buf := make([]byte, 0, n)
	take := func(rg [2]int) []byte {
		if rg[1] == 0 {
			return nil
		}
		s := len(buf)
		buf = append(buf, d.b[rg[0]:rg[1]]...)
		return buf[s:len(buf):len(buf)]
	}
	r := &blk.req.AdmissionRequest
	r.Object.Raw = take(d.obj)
	r.OldObject.Raw = take(d.old)
	r.Options.Raw = take(d.opts)
	// The index is of the last object scanned; it serves only if that is
	// the object kept (a later null keeps an earlier one).
	if from, ok := blk.index.From(); ok && d.obj[1] != 0 && from == d.obj[0] && blk.index.Bind(r.Object.Raw) {
		blk.req.objectIndex = &blk.index
	}
	return blk
}

func isNull(b []byte, i int) bool { return jsonscan.HasLiteral(b, i, "null") }

func hasLiteral(b []byte, i int, lit string) bool { return jsonscan.HasLiteral(b, i, lit) }

func hasByte(b []byte, c byte) bool {
	for _, x := range b {
		if x == c {
			return true
		}
	}
	return false
}
