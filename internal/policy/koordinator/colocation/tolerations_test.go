package colocation

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/policy/shared/toleration"
)

// haveTolerations are the profile tolerations the tolerationsHave tests
// look for.
var haveTolerations = []corev1.Toleration{
	{Key: "t", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: new(int64(9007199254740993))},
	{Key: "colocation", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: "k", Operator: corev1.TolerationOpEqual, Value: "v"},
	{},
}

// checkTolerationsHave is the differential check of tolerationsHave: when
// it answers, its answer is the decoded elements (toleration.Of, the reader
// Mutate used before) that equal one of ts, and the list decodes without
// error, unless none of ts' keys is in it (toleration.KeysAbsent, whose
// own tests check that no element has one): then the answer is empty and
// the rest of the list is not read. When it declines, Mutate reads with
// toleration.Of as before.
func checkTolerationsHave(t *testing.T, list string, ts []corev1.Toleration) (ok bool) {
	t.Helper()
	doc := []byte(`{"spec":{"tolerations":` + list + `}}`)
	if !jsonedit.Valid(doc) {
		return false
	}
	got, ok, err := tolerationsHave(jsonedit.NewDoc(doc), []string{"spec", "tolerations"}, ts)
	all, werr := toleration.Of(jsonedit.NewDoc(doc), "spec", "tolerations")
	if err != nil {
		t.Fatalf("%s: tolerationsHave error %v (the list is there)", list, err)
	}
	if !ok {
		return false
	}
	if toleration.KeysAbsent(doc[len(`{"spec":{"tolerations":`):len(doc)-2], ts) {
		if len(got) > 0 {
			t.Fatalf("%s: none of the keys is in the list, tolerationsHave %v", list, got)
		}
		if werr != nil {
			return true // not read, as documented
		}
	}
	if werr != nil {
		t.Fatalf("%s: tolerationsHave answered, but the list does not decode: %v", list, werr)
	}
	var want []corev1.Toleration
	for _, have := range all {
		if i := slices.IndexFunc(ts, func(t corev1.Toleration) bool { return sameToleration(have, t) }); i >= 0 {
			want = append(want, ts[i])
		}
	}
	if len(got) != len(want) || !slices.EqualFunc(got, want, sameToleration) {
		t.Fatalf("%s: tolerationsHave %v, decoded list has %v", list, got, want)
	}
	return true
}

func TestTolerationsHaveMatchesDecoding(t *testing.T) {
	for _, c := range []struct {
		list string
		ok   bool
	}{
		{`null`, true}, {`[]`, true}, {` [ ] `, true},
		{`[{"key":"x"},{"effect":"NoExecute","operator":"Exists","key":"t","tolerationSeconds":9007199254740993},{"key":"colocation","operator":"Exists","effect":"NoSchedule"}]`, true},
		{`[{"key":"t","operator":"Exists","effect":"NoExecute","tolerationSeconds":9007199254740992}]`, true},
		{`[{"key":"t","operator":"Exists","effect":"NoExecute"}]`, true},
		{`[{"key":"t","operator":"Exists","effect":"NoExecute","tolerationSeconds":null,"tolerationSeconds":9007199254740993}]`, true},
		{`[{"key":"t","operator":"Exists","effect":"NoExecute","tolerationSeconds":9007199254740993,"tolerationSeconds":null}]`, true},
		{`[{}, {"key":"k","operator":"Equal","value":"v"}, { "key" : "k" , "value" : "v" }]`, true},
		{"[{\"key\":\"k\xff\"}]", true},
		// Declined: the decoder reads these (or refuses them).
		{`[{"key":"\u0074","operator":"Exists","effect":"NoExecute","tolerationSeconds":9007199254740993}]`, false},
		{`[{"key":"t","extra":1}]`, false},
		{`[{"key":null}]`, false},
		{`[{"key":"t"},1]`, false},
		{`[{"tolerationSeconds":1.5}]`, false},
		{`[{"tolerationSeconds":"1"}]`, false},
		{`[{"tolerationSeconds":99999999999999999999}]`, false},
		{`{"key":"t"}`, false},
		{`"t"`, false},
		{`[` + strings.Repeat(`{"key":"x"},`, maxScanTolerations) + `{"key":"t"}]`, false},
		{`[` + strings.Repeat(`{"key":"x"},`, maxScanTolerations-1) + `{"key":"t"}]`, true},
	} {
		if ok := checkTolerationsHave(t, c.list, haveTolerations); ok != c.ok {
			t.Errorf("%.80s: answered %v, want %v", c.list, ok, c.ok)
		}
	}
	// With keyed tolerations only, a list without their keys is answered
	// without reading its elements, even one the decoder refuses; a list
	// that names one is read as above.
	keyed := haveTolerations[:3]
	for _, c := range []struct {
		list string
		ok   bool
	}{
		{`[{"key":"x","operator":"Exists"},{"key":"y","effect":"NoExecute","tolerationSeconds":300}]`, true},
		{`[{"key":"x","tolerationSeconds":"1"},{"key":"y","extra":1}]`, true},
		{`[{"key":"colocation","operator":"Exists","effect":"NoSchedule"},{"key":"y"}]`, true},
		{`[{"key":"colocation","tolerationSeconds":"1"}]`, false},
		{`[{"key":"\u0078"}]`, false},
		{`{"key":"x"}`, false},
	} {
		if ok := checkTolerationsHave(t, c.list, keyed); ok != c.ok {
			t.Errorf("keyed %.80s: answered %v, want %v", c.list, ok, c.ok)
		}
	}
	// A path through something else is Get's error, as toleration.Of's.
	_, _, err := tolerationsHave(jsonedit.NewDoc([]byte(`{"spec":"x"}`)), []string{"spec", "tolerations"}, haveTolerations)
	_, werr := toleration.Of(jsonedit.NewDoc([]byte(`{"spec":"x"}`)), "spec", "tolerations")
	if err == nil || fmt.Sprint(err) != fmt.Sprint(werr) {
		t.Fatalf("error %v, toleration.Of's %v", err, werr)
	}
}

// FuzzTolerationsHave: on any list, tolerationsHave answers only for a
// list that decodes, and then as the decoded list does.
func FuzzTolerationsHave(f *testing.F) {
	for _, s := range []string{`[{"key":"t","operator":"Exists","effect":"NoExecute","tolerationSeconds":9007199254740993}]`,
		`[{"key":"k","value":"v","operator":"Equal"},{}]`, `[{"key":"colocation","operator":"Exists","effect":"NoSchedule","tolerationSeconds":null}]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, list string) {
		if len(list) > 4096 {
			return
		}
		checkTolerationsHave(t, list, haveTolerations)
		checkTolerationsHave(t, list, haveTolerations[:3])
	})
}

// TestUnchangedMapsShared: a profile that only sets a label leaves the
// pod's annotations and node selector the pod's own maps (not copied, not
// compared by Write); with recordProfiles the annotations are copied
// before the record is added, and the pod's own map is left alone.
func TestUnchangedMapsShared(t *testing.T) {
	pod := []byte(`{"metadata":{"labels":{"team":"a"},"annotations":{"x":"y"}},"spec":{"nodeSelector":{"n":"1"},"containers":[{"name":"c"}]}}`)
	for _, record := range []bool{false, true} {
		p, err := New(Config{RecordProfiles: record, Profiles: []Profile{{Name: "only-labels", Labels: map[string]string{"l": "v"}}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ops, v := p.Mutate(t.Context(), podReq("ns", "CREATE", pod, nil))
		if !v.Allowed {
			t.Fatalf("record %v: %+v", record, v)
		}
		want := `[{"op":"add","path":"/metadata/labels/l","value":"v"}]`
		if record {
			want = `[{"op":"add","path":"/metadata/labels/l","value":"v"},{"op":"add","path":"/metadata/annotations/kadmit.io~1colocation-profiles","value":"only-labels"}]`
		}
		if got, _ := jsonedit.AppendPatch(nil, ops); string(got) != want {
			t.Fatalf("record %v: patch %s, want %s", record, got, want)
		}
		have := &Object{Labels: map[string]string{"team": "a"}, Annotations: map[string]string{"x": "y"}, HasSpec: true}
		res, err := p.profiles.Apply(have, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if record {
			res.RecordApplied()
		}
		if len(have.Annotations) != 1 || res.Want.shared&mAnnotations != 0 == record {
			t.Fatalf("record %v: the pod's annotations %v, want's %v (shared %b)", record, have.Annotations, res.Want.Annotations, res.Want.shared)
		}
	}
}
