package admission

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/jsonedit"
)

// apiServerRequest is a request member as the API server writes it, in its
// field order: every field of AdmissionRequest set, on an UPDATE.
var apiServerMembers = []string{
	`"uid":"705ab4f5-6393-11e8-b7cc-42010a800002"`,
	`"kind":{"group":"","version":"v1","kind":"Pod"}`,
	`"resource":{"group":"","version":"v1","resource":"pods"}`,
	`"subResource":"status"`,
	`"requestKind":{"group":"","version":"v1","kind":"Pod"}`,
	`"requestResource":{"group":"","version":"v1","resource":"pods"}`,
	`"requestSubResource":"status"`,
	`"name":"web-7d4b9c-x2x9z"`,
	`"namespace":"shop"`,
	`"operation":"UPDATE"`,
	`"userInfo":{"username":"system:serviceaccount:kube-system:replicaset-controller","uid":"0b5c5e44-9d0b-4a40-8d7c-1f0f0b2b5e1a","groups":["system:serviceaccounts","system:serviceaccounts:kube-system","system:authenticated"],"extra":{"authentication.kubernetes.io/credential-id":["JTI=7f2c1d4e"],"authentication.kubernetes.io/node-name":["kind-control-plane"]}}`,
	`"object":` + podJSON,
	`"oldObject":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}`,
	`"dryRun":false`,
	`"options":{"kind":"UpdateOptions","apiVersion":"meta.k8s.io/v1"}`,
}

func envelope(apiVersion string, members []string) []byte {
	return []byte(`{"kind":"AdmissionReview","apiVersion":"` + apiVersion + `","request":{` + strings.Join(members, ",") + `}}`)
}

// hostileValues replace a member's value in envelopeCorpus: every JSON
// type, nulls inside arrays, escapes, invalid UTF-8, invalid JSON.
var hostileValues = []string{
	`null`, `1`, `-0.5e3`, `true`, `false`, `"s"`, `""`, `[]`, `{}`, `["a",null]`, `["a","b","c","d","e","f"]`,
	`[1]`, `{"group":1}`, `{"Group":"g","KIND":"k","kind":null,"version":"v","x":[{}]}`, `{"group":"g","group":"h"}`,
	`"\u00e9\n\ud800\"\\\/"`, "\"\xff\xfe\"", "\"caf\u00e9\"", `"\u212a"`, `{"a":["x"],"a":null,"b":[],"c\u0041":["\u0000"]}`,
	`{"username":"u","UserName":"v"}`, `{"groups":null,"extra":null}`, `{"extra":{"k":[null]}}`, `{"extra":{"k":"v"}}`,
	`nul`, `tru`, `"open`, `{`, `[1,]`, `{"a" 1}`, `01`,
}

// keyVariants rename a member's key in envelopeCorpus: case and Unicode
// folding variants, which the case-sensitive decoder must not take for the
// field (the fast path skips them), and escapes, which it must.
func keyVariants(key string) []string {
	out := []string{strings.ToUpper(key), strings.ToLower(key), strings.ToUpper(key[:1]) + key[1:], key + "_", "_" + key,
		`\u00` + fmt.Sprintf("%02x", key[0]) + key[1:], key + "x", "x"}
	if i := strings.IndexAny(key, "kK"); i >= 0 {
		out = append(out, key[:i]+"\u212a"+key[i+1:]) // KELVIN SIGN folds to k
	}
	if i := strings.IndexAny(key, "sS"); i >= 0 {
		out = append(out, key[:i]+"\u017f"+key[i+1:]) // LATIN SMALL LETTER LONG S folds to s
	}
	return out
}

// envelopeCorpus is the differential corpus: bodies as the API server
// writes them, and every single-member change of one (value replaced,
// key renamed, member repeated or dropped) at the top level, in request
// and in userInfo.
func envelopeCorpus() [][]byte {
	var out [][]byte
	add := func(b []byte) { out = append(out, b) }
	add(envelope(APIVersionV1, apiServerMembers))
	add(envelope(APIVersionV1beta1, apiServerMembers))
	add(reviewBody(APIVersionV1, "u1", podJSON))
	add(reviewBody(APIVersionV1beta1, "u1", `null`))
	add(reviewBody(APIVersionV1, "u1", `"a string"`))
	for _, b := range []string{
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","oldObject":{"a":1},"object":{"b":[2]}}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"b":1},"oldObject":null}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","Object":{"b":1}}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"b":1},"object":null}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"b":1},"object":{"c":2}}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"b":1},"object":[3]}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","Request":{"uid":"u","object":{}}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","obj\u0065ct":{"x":1}}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":null}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"x":1}},"request":{"uid":"v"}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u"},"request":null}`,
		` { "apiVersion" : "admission.k8s.io/v1" , "request" : { "object" : { "x" : [ 1 , 2 ] } , "uid" : "u" } , "kind":"AdmissionReview" } `,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"x":1},"dryRun":"yes"}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","dryRun":true,"dryRun":null}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","uid":null}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","uid":"v","name":"a","name":"b"}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u"},"response":{"uid":"r","allowed":true}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u"},"response":null}`,
		`{"apiVersion":"admission.k8s.io/v1","apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u"}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"a":1,"a":2,"\u0061":3}}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"metadata":{"name":"a"},"Metadata":{"Name":"b","name":"c"},"meta\u0064ata":{"generateName":"g"},"spec":{"x":1},"Kind":"K"}}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"metadata":{"name":1}}}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"metadata":[]}}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"a":1}}}x`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"a":1}}} `,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"a":1},}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","userInfo":{"groups":[],"extra":{}}}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","userInfo":{"extra":{"a":[],"b":null,"a":["x"]}}}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","userInfo":{"groups":["a"],"groups":["b"]}}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"kind":"A"},"kind":{"group":"g"}}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","requestKind":{"kind":"A"},"requestKind":null}}`,
		`[]`, `null`, `"x"`, `{}`, ``, `{"apiVersion":`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":` +
			strings.Repeat("[", 9997) + strings.Repeat("]", 9997) + `}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":` +
			strings.Repeat("[", 9998) + strings.Repeat("]", 9998) + `}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","x":` +
			strings.Repeat("[", 9998) + strings.Repeat("]", 9998) + `}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","x":` +
			strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","userInfo":{"extra":{"k":` +
			strings.Repeat("[", 9996) + strings.Repeat("]", 9996) + `}}}}`,
	} {
		add([]byte(b))
	}
	// Single-member changes of the API server's body, in request.
	for i, m := range apiServerMembers {
		key, _, _ := strings.Cut(m[1:], `"`)
		rest := apiServerMembers[:i:i]
		after := apiServerMembers[i+1:]
		with := func(ms ...string) []byte {
			return envelope(APIVersionV1, append(append(append([]string{}, rest...), ms...), after...))
		}
		add(with())                    // dropped
		add(with(m, m))                // repeated
		add(with(m, `"`+key+`":null`)) // repeated, then null
		add(with(`"`+key+`":null`, m)) // null, then repeated
		for _, v := range hostileValues {
			add(with(`"` + key + `":` + v))
			add(with(m, `"`+key+`":`+v))
		}
		for _, k := range keyVariants(key) {
			add(with(`"` + k + `"` + m[len(key)+2:]))
			add(with(m, `"`+k+`":null`))
		}
	}
	// The same in userInfo and kind.
	for _, m := range []string{`"username":"u"`, `"uid":"x"`, `"groups":["a","b"]`, `"extra":{"k":["v"]}`} {
		key, _, _ := strings.Cut(m[1:], `"`)
		for _, v := range append(hostileValues, strings.SplitN(m, ":", 2)[1]) {
			add(envelope(APIVersionV1, []string{`"uid":"u"`, `"userInfo":{` + m + `,"` + key + `":` + v + `}`}))
		}
		for _, k := range keyVariants(key) {
			add(envelope(APIVersionV1, []string{`"uid":"u"`, `"userInfo":{"` + k + `":` + strings.SplitN(m, ":", 2)[1] + `}`}))
		}
	}
	for _, k := range []string{"group", "version", "kind", "resource"} {
		for _, v := range hostileValues {
			add(envelope(APIVersionV1, []string{`"uid":"u"`, `"kind":{"` + k + `":` + v + `}`, `"requestResource":{"` + k + `":` + v + `}`}))
		}
		for _, kv := range keyVariants(k) {
			add(envelope(APIVersionV1, []string{`"uid":"u"`, `"kind":{"` + kv + `":"x"}`, `"requestResource":{"` + kv + `":"x"}`}))
		}
	}
	// And at the top level.
	for _, k := range []string{"apiVersion", "kind", "request", "response"} {
		for _, kv := range keyVariants(k) {
			add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u"},"` + kv + `":"x"}`))
		}
	}
	return out
}

// checkEnvelope holds DecodeReview to the previous decoder's answer on
// body: the same Review, or the same error message.
func checkEnvelope(t *testing.T, body []byte) {
	t.Helper()
	got, gotReq, err := decodeRequest(body)
	want, wantErr := oldDecodeReview(body)
	if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
		t.Fatalf("%q:\nerror %v\nwant  %v", trunc(body), err, wantErr)
	}
	if err != nil {
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\ngot  %#v\nwant %#v", trunc(body), got.Request, want.Request)
	}
	if !reflect.DeepEqual(gotReq.AdmissionRequest, *want.Request) {
		t.Fatalf("%q: Request differs from Review.Request", trunc(body))
	}
	// A Doc from the index reads what a fresh Doc reads, and a pruned
	// decode gives what DecodeFields gives.
	checkSameDoc(t, gotReq.ObjectDoc(), jsonedit.NewDoc(bytes.Clone(gotReq.Object.Raw)))
	var a, b prunedNames
	ca, ea := gotReq.DecodeObjectFields(Keep{"metadata": {"name": nil, "generateName": nil}}, &a)
	cb, eb := DecodeFields(bytes.Clone(gotReq.Object.Raw), Keep{"metadata": {"name": nil, "generateName": nil}}, &b)
	if a != b || ca != cb || fmt.Sprint(ea) != fmt.Sprint(eb) {
		t.Fatalf("%q: DecodeObjectFields %+v %v %v, DecodeFields %+v %v %v", trunc(body), a, ca, ea, b, cb, eb)
	}
	if gotReq.objectIndex != nil {
		pa, _, _ := pruneIndexed(gotReq.Object.Raw, gotReq.objectIndex, podNamesKeepTest)
		pb, _, _ := pruneDoc(gotReq.Object.Raw, podNamesKeepTest)
		if !bytes.Equal(pa, pb) {
			t.Fatalf("%q: pruned with the index %q, without %q", trunc(body), pa, pb)
		}
	}
}

var podNamesKeepTest = Keep{"metadata": {"name": nil, "generateName": nil, "labels": nil}, "kind": nil, "SPEC": {"x": nil}}

// checkSameDoc compares what two Docs over the same JSON read at a few
// paths, and the operations the same edits give.
func checkSameDoc(t *testing.T, a, b *jsonedit.Doc) {
	t.Helper()
	for _, p := range [][]string{nil, {"metadata"}, {"metadata", "name"}, {"spec", "containers", "0"}, {"a"}, {"x", "1"}, {"0"}} {
		ga, ea := a.Get(p...)
		gb, eb := b.Get(p...)
		if !bytes.Equal(ga, gb) || fmt.Sprint(ea) != fmt.Sprint(eb) {
			t.Fatalf("Get %q: %q, %v; fresh Doc %q, %v", p, ga, ea, gb, eb)
		}
	}
	ea, eb := a.Set("v", "metadata", "labels", "k"), b.Set("v", "metadata", "labels", "k")
	ra, rb := a.Remove("spec"), b.Remove("spec")
	if fmt.Sprint(ea, ra) != fmt.Sprint(eb, rb) || fmt.Sprint(a.Ops()) != fmt.Sprint(b.Ops()) {
		t.Fatalf("edits: %v %v %v; fresh Doc %v %v %v", ea, ra, a.Ops(), eb, rb, b.Ops())
	}
}

func TestDecodeEnvelopeMatchesUnmarshal(t *testing.T) {
	corpus := envelopeCorpus()
	for _, body := range corpus {
		checkEnvelope(t, body)
	}
	t.Logf("%d bodies", len(corpus))
}

// TestDecodeEnvelopeFastPath checks that what the API server sends is
// decoded without the reflecting decoder (the envelope decoder does not
// decline) and that the object's index is handed to the Request.
func TestDecodeEnvelopeFastPath(t *testing.T) {
	for _, body := range [][]byte{
		envelope(APIVersionV1, apiServerMembers),
		envelope(APIVersionV1beta1, apiServerMembers),
		reviewBody(APIVersionV1, "u", podJSON),
		envelope(APIVersionV1, []string{`"uid":"u"`, `"userInfo":{"username":"caf\u00e9","groups":["a","b","c","d","e"],"extra":{"\u00e9":["\"x\""]}}`, `"object":{"a":1}`}),
	} {
		blk, ok := decodeEnvelope(body)
		if !ok {
			t.Fatalf("declined %s", body)
		}
		if blk.req.objectIndex == nil {
			t.Fatalf("no object index for %s", body)
		}
		checkEnvelope(t, body)
	}
	// More members than an Index holds: no index, same answers.
	members := make([]string, jsonedit.IndexMembers+1)
	for i := range members {
		members[i] = fmt.Sprintf(`"m%d":%d`, i, i)
	}
	body := envelope(APIVersionV1, []string{`"uid":"u"`, `"object":{` + strings.Join(members, ",") + `}`})
	if blk, ok := decodeEnvelope(body); !ok || blk.req.objectIndex != nil {
		t.Fatalf("ok %v, index %v for an object of %d members", ok, blk.req.objectIndex != nil, len(members))
	}
	checkEnvelope(t, body)
}

// FuzzDecodeEnvelope holds the envelope decoder to the API server's
// decoder (jsonedit.Unmarshal) on any body: the same Review, or the same error.
func FuzzDecodeEnvelope(f *testing.F) {
	// Every 20th body of the corpus (the whole corpus is
	// TestDecodeEnvelopeMatchesUnmarshal's): the engine's baseline pass
	// over 1,600 seeds would take longer than `make fuzz` gives a target.
	for i, b := range envelopeCorpus() {
		if i%20 == 0 && len(b) < 4096 {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkEnvelope(t, body)
	})
}

// oldDecodeReview is DecodeReview without the envelope decoder: the API
// server's decoder (jsonedit.Unmarshal, sigs.k8s.io/json case-sensitive)
// over the whole body, then the same checks. The differential tests hold
// the envelope decoder to its answers and error messages.
func oldDecodeReview(body []byte) (*Review, error) {
	var r Review
	if err := jsonedit.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrMalformedReview, oneLine(err.Error()))
	}
	if r.APIVersion != APIVersionV1 && r.APIVersion != APIVersionV1beta1 {
		return nil, fmt.Errorf("%w: apiVersion %q is not %s or %s", ErrMalformedReview, r.APIVersion, APIVersionV1, APIVersionV1beta1)
	}
	if r.Kind != ReviewKind {
		return nil, fmt.Errorf("%w: kind %q is not %s", ErrMalformedReview, r.Kind, ReviewKind)
	}
	if r.Request == nil {
		return nil, fmt.Errorf("%w: request is missing", ErrMalformedReview)
	}
	if r.Request.UID == "" {
		return nil, fmt.Errorf("%w: request.uid is missing", ErrMalformedReview)
	}
	return &r, nil
}

// TestObjectDocAfterMutator checks that the second mutator of a chain reads
// the object the first one made, through an index of that object
// (jsonedit.ApplyIndexed), not the index of the object sent.
func TestObjectDocAfterMutator(t *testing.T) {
	var seenIndexed []bool
	var label []byte
	mut := func(set bool) Mutator {
		return MutatorFunc(func(_ context.Context, req *Request) ([]jsonedit.Op, Verdict) {
			seenIndexed = append(seenIndexed, req.objectIndex != nil)
			d := req.ObjectDoc()
			if !set {
				label, _ = d.Get("metadata", "labels", "added")
				return nil, Allow()
			}
			if err := d.Set("yes", "metadata", "labels", "added"); err != nil {
				return nil, Invalid("%v", err)
			}
			return d.Ops(), Allow()
		})
	}
	whs, err := NewWebhooks([]Hook{
		{Policy: "first", Path: "/mutate", Type: Mutating, Rules: podRule, Mutator: mut(true)},
		{Policy: "second", Path: "/mutate", Type: Mutating, Rules: podRule, Mutator: mut(false)},
	})
	if err != nil {
		t.Fatal(err)
	}
	w, rev := post(t, NewHandler(whs[0], HandlerOptions{}), "application/json", reviewBody(APIVersionV1, "u", podJSON))
	if w.Code != 200 || !rev.Response.Allowed {
		t.Fatalf("code %d: %s", w.Code, w.Body.String())
	}
	if string(label) != `"yes"` || fmt.Sprint(seenIndexed) != "[true true]" {
		t.Fatalf("second mutator read %q; indexed %v", label, seenIndexed)
	}
}

// TestEnvelopeDecoderPoolBound: a decoder grown by a huge envelope (here a
// 100 KB user name and 5,000 groups) is dropped, not pooled.
func TestEnvelopeDecoderPoolBound(t *testing.T) {
	groups := make([]string, 5000)
	for i := range groups {
		groups[i] = fmt.Sprintf("%q", fmt.Sprint("g", i))
	}
	body := envelope(APIVersionV1, []string{`"uid":"u"`,
		`"userInfo":{"username":"` + strings.Repeat("u", 100<<10) + `","groups":[` + strings.Join(groups, ",") + `]}`})
	blk, ok := decodeEnvelope(body)
	if !ok || len(blk.req.UserInfo.Username) != 100<<10 || len(blk.req.UserInfo.Groups) != 5000 || blk.req.UserInfo.Groups[4999] != "g4999" {
		t.Fatalf("ok %v", ok)
	}
	checkEnvelope(t, body)
	for range 4 {
		d := envDecoders.Get().(*envDecoder)
		if cap(d.arena) > maxPooledDecoder || cap(d.refs) > maxPooledDecoder/32 || len(d.refs) != 0 || d.blk != nil {
			t.Fatalf("pooled decoder holds %d arena bytes, %d refs (%d in use)", cap(d.arena), cap(d.refs), len(d.refs))
		}
	}
}
