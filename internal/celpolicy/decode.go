package celpolicy

import (
	"context"
	"fmt"
	"sync"
	"unsafe"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8sjson "sigs.k8s.io/json"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/jsonedit"
)

// decodeObject decodes the JSON object raw into an Unstructured of kind
// gvk, as the API server's unstructured decoder does
// (unstructured.UnstructuredJSONScheme, apimachinery v0.37.1: every member
// through sigs.k8s.io/json with integers kept exact; "kind" required); nil
// for no object. what names the object in errors. The estimate of the
// decoded object is charged to m first (see Budget).
func decodeObject(raw []byte, gvk schema.GroupVersionKind, what string, m *meter) (runtime.Object, error) {
	if raw == nil {
		return nil, nil
	}
	if err := m.chargeJSON(raw); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(raw); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	// The dispatchers convert the object to the policy's matched kind and
	// skip conversion when the kinds are equal (admission/conversion.go
	// ConvertToGVK): an AdmissionReview object is in the request's kind.
	u.SetGroupVersionKind(gvk)
	return u, nil
}

// decodeFields is decodeObject keeping only the top-level members fs (all
// of them when fs is nil). A member is decoded exactly as the whole-object
// decoder decodes it, so an expression reading only those members sees
// the same values; the members left out are the ones no expression reads.
// JSON the whole-object decoder refuses (not an object, invalid) goes
// through it, for its error. The estimate of the members decoded is
// charged to m first (see Budget).
func decodeFields(raw []byte, gvk schema.GroupVersionKind, what string, fs fieldSet, m *meter) (runtime.Object, error) {
	if raw == nil || fs == nil {
		return decodeObject(raw, gvk, what, m)
	}
	doc := jsonedit.NewDoc(raw)
	if root, err := doc.Get(); err != nil || root[0] != '{' {
		return decodeObject(raw, gvk, what, m)
	}
	members := make(map[string][]byte, len(fs))
	var cost int64
	for name := range fs {
		v, err := doc.Get(name)
		if err != nil {
			return decodeObject(raw, gvk, what, m)
		}
		if v != nil {
			members[name] = v
			cost += estimate(v)
		}
	}
	if err := m.charge(cost); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	obj := make(map[string]any, len(members))
	for name, v := range members {
		var x any
		if err := k8sjson.UnmarshalCaseSensitivePreserveInts(v, &x); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		obj[name] = x
	}
	u := &unstructured.Unstructured{Object: obj}
	if u.GetKind() == "" {
		return nil, fmt.Errorf("%s: %w", what, runtime.NewMissingKindErr(string(raw)))
	}
	u.SetGroupVersionKind(gvk)
	return u, nil
}

// decoded is one admission request's object and oldObject as the
// validating policies read them (decodeFields with the union of their
// members), decoded once and shared, read-only, by every validating hook
// the request reaches: k8s.io/apiserver v0.37.1's validating dispatcher
// only reads them (validating/dispatcher.go Dispatch passes them to the
// matcher, which reads labels through meta.Accessor, and, in
// admission.VersionedAttributes, to CEL, which reads them through
// types.DefaultTypeAdapter.NativeToValue; ConvertToGVK returns the object
// itself when the kinds are equal and a new one otherwise). oldFull is
// oldObject whole, for the mutating policies, whose dispatcher only reads
// it too ("VersionedOldObject ... must never be mutated",
// admission/conversion.go); their object is decoded per policy, since the
// mutating dispatcher writes the patched object back into it
// (mutating/dispatcher.go:221).
type decoded struct {
	// m holds what the shared decodes took from the engine's Budget,
	// given back when the request's context ends; nil for a value private
	// to one hook call, whose decodes charge the call's meter.
	m *meter

	once     sync.Once
	obj, old runtime.Object
	err      error

	oldOnce sync.Once
	oldFull runtime.Object
	oldErr  error
}

// requestCache keeps the decoded objects of the last few admission
// requests, keyed by the *admission.Request the webhook chain hands every
// hook of one request (admission.Webhook.review: the same pointer until a
// mutator changes the object, then a new one). An entry holds its request,
// so no other request can have that address while the entry lives; the
// object's bytes are compared by identity too. Hooks of one request run one
// after another, so a handful of entries serves many requests in flight; a
// request whose entry was evicted decodes again, nothing else.
//
// Memory is bounded three times: at most requestCacheSize entries, at most
// requestCacheBytes of object and oldObject JSON held by them (a request
// larger than that is not kept at all, and each of its hooks decodes for
// itself), and an entry lives only as long as its request: it is dropped,
// and what its decodes took from the Budget given back, when the
// request's context ends (the handler cancels it once the answer is sent,
// or at the deadline of an abandoned review). A request whose context can
// never end (offline use) is not kept either.
type requestCache struct {
	budget  *Budget
	mu      sync.Mutex
	entries []cacheEntry // oldest first
	bytes   int
}

// The bounds of requestCache.
const (
	requestCacheSize  = 32
	requestCacheBytes = 4 << 20
)

type cacheEntry struct {
	req      *admission.Request
	obj, old *byte
	n, oldN  int
	d        *decoded
}

// get returns the decoded objects of req: its entry's, or a new entry's
// (evicting the oldest ones to stay within the bounds, and dropped when
// ctx ends), entered (the caller leaves d.m when done), or, for a request
// above requestCacheBytes or whose ctx never ends, a fresh value no other
// hook will see (d.m nil).
func (c *requestCache) get(ctx context.Context, req *admission.Request) *decoded {
	obj, old := req.Object.Raw, req.OldObject.Raw
	po, pold := unsafe.SliceData(obj), unsafe.SliceData(old)
	size := len(obj) + len(old)
	if size > requestCacheBytes || ctx.Done() == nil {
		return &decoded{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.entries {
		e := &c.entries[i]
		if e.req == req && e.obj == po && e.n == len(obj) && e.old == pold && e.oldN == len(old) {
			e.d.m.enter()
			return e.d
		}
	}
	drop := 0
	for drop < len(c.entries) && (len(c.entries)-drop >= requestCacheSize || c.bytes+size > requestCacheBytes) {
		c.bytes -= c.entries[drop].n + c.entries[drop].oldN
		drop++
	}
	if drop > 0 {
		// Clear the dropped entries so they hold no request.
		clear(c.entries[:drop])
		c.entries = append(c.entries[:0], c.entries[drop:]...)
	}
	d := &decoded{m: &meter{b: c.budget}} // without a Budget, it never charges: the entry is shared all the same
	c.entries = append(c.entries, cacheEntry{req: req, obj: po, n: len(obj), old: pold, oldN: len(old), d: d})
	c.bytes += size
	d.m.enter()
	context.AfterFunc(ctx, func() { c.drop(d) })
	return d
}

// drop removes d's entry, if still cached, and gives back what its
// decodes took once no hook runs on it: a hook still running on d (an
// abandoned review) keeps the charge until it returns; the interrupt
// check stops its CEL evaluation.
func (c *requestCache) drop(d *decoded) {
	c.mu.Lock()
	for i := range c.entries {
		if e := c.entries[i]; e.d == d {
			c.bytes -= e.n + e.oldN
			c.entries = append(c.entries[:i], c.entries[i+1:]...)
			c.entries[len(c.entries):cap(c.entries)][0] = cacheEntry{} // hold no request
			break
		}
	}
	c.mu.Unlock()
	d.m.end()
}

// meterFor is the meter d's decodes charge: d's own when it is shared,
// else the calling hook's.
func (d *decoded) meterFor(r *Request) *meter {
	if d.m != nil {
		return d.m
	}
	return r.meter
}

// objects returns r's object and oldObject decoded with fs, once for d.
func (d *decoded) objects(r *Request, fs fieldSet) (obj, old runtime.Object, err error) {
	d.once.Do(func() {
		m := d.meterFor(r)
		if d.obj, d.err = decodeFields(r.Object, r.Kind, "object", fs, m); d.err == nil {
			d.old, d.err = decodeFields(r.OldObject, r.Kind, "oldObject", fs, m)
		}
	})
	return d.obj, d.old, d.err
}

// oldObject returns r's oldObject decoded whole, once for d.
func (d *decoded) oldObject(r *Request) (runtime.Object, error) {
	d.oldOnce.Do(func() {
		d.oldFull, d.oldErr = decodeObject(r.OldObject, r.Kind, "oldObject", d.meterFor(r))
	})
	return d.oldFull, d.oldErr
}
