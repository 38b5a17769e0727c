package nodeovercommit

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/quantity"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// decodeList must give json.Unmarshal's result and error for every list.
func TestDecodeListMatchesUnmarshal(t *testing.T) {
	long := `"` + strings.Repeat("1", quantity.MaxLen+1) + `"`
	corpus := []string{
		`{}`, `null`, `{"cpu":"4"}`, `{"cpu":"4","memory":"16318412Ki","pods":"110","ephemeral-storage":"93478772582"}`,
		`{ "cpu" : "3500m" , "hugepages-1Gi" : "0" }`, `{"cpu":"4","cpu":"8"}`, `{"cpu":"x","cpu":"8"}`, `{"cpu":"8","cpu":"x"}`,
		`{"cpu":4}`, `{"cpu":4.5e3}`, `{"cpu":null}`, `{"cpu":true}`, `{"cpu":{}}`, `{"cpu":[]}`,
		`{"cpu":"1e9999999"}`, `{"memory":"1e9999999","cpu":"x"}`, `{"cpu":` + long + `}`, `{"cpu":"\u0034"}`,
		`{"c\u0070u":"4"}`, `{"cpu":"4\"}"}`, `[]`, `"4"`, `4`, `{"a":"1","b":"2","c":"-1","d":"1Ei","e":"9Ei"}`,
	}
	var many strings.Builder
	many.WriteString("{")
	for i := range maxListMembers + 2 {
		if i > 0 {
			many.WriteString(",")
		}
		fmt.Fprintf(&many, `"r%03d":"%d"`, i, i)
	}
	many.WriteString("}")
	corpus = append(corpus, many.String())
	for _, raw := range corpus {
		if !json.Valid([]byte(raw)) {
			t.Fatalf("corpus entry %s is not valid JSON", raw)
		}
		var want quantity.List
		werr := json.Unmarshal([]byte(raw), &want)
		got, gerr := decodeList([]byte(raw))
		if fmt.Sprint(werr) != fmt.Sprint(gerr) {
			t.Errorf("%s: error %v, want %v", raw, gerr, werr)
			continue
		}
		if werr != nil {
			continue
		}
		if (want == nil) != (got == nil) || len(want) != len(got) {
			t.Errorf("%s: %v, want %v", raw, got, want)
			continue
		}
		for k, q := range want {
			g, ok := got[k]
			if !ok || g.Cmp(q) != 0 || g.String() != q.String() {
				t.Errorf("%s: %s = %v, want %v", raw, k, got[k], q)
			}
		}
	}
}

// encodeRawValues by hand must give json.Marshal's bytes.
func TestEncodeRawValuesMatchesMarshal(t *testing.T) {
	for _, names := range [][]string{{}, {"cpu"}, {"cpu", "memory", "example.com/gpu"}, {"a<b", "cpu"}, {"é", "cpu"}, {`q"`, "z"}} {
		r := rawQuantities{allocatable: map[corev1.ResourceName]resource.Quantity{}, capacity: map[corev1.ResourceName]resource.Quantity{}}
		for i, n := range names {
			r.allocatable[corev1.ResourceName(n)] = resource.MustParse(fmt.Sprintf("%dm", 3500+i))
			r.capacity[corev1.ResourceName(n)] = resource.MustParse(fmt.Sprintf("%dKi", 4+i))
		}
		v := RawValues{Allocatable: map[corev1.ResourceName]string{}, Capacity: map[corev1.ResourceName]string{}}
		for n, q := range r.allocatable {
			v.Allocatable[n] = q.String()
		}
		for n, q := range r.capacity {
			v.Capacity[n] = q.String()
		}
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		got, err := encodeRawValues(r)
		if err != nil || got != string(want) {
			t.Errorf("%v: %s (%v), want %s", names, got, err, want)
		}
	}
}
