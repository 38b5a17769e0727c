package admission

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/jsonedit"
	"github.com/kadmit/kadmit/internal/jsonedit/jsonscan"
)

var scanSeeds = []string{
	`{}`, `[]`, `null`, `true`, `false`, `0`, `-0`, `1.5e-3`, `-12E+2`, `"a\"b\\c\/\b\f\n\r\t\u00e9"`,
	` {"a" : [1, 2, {"b": null}] } `, `{"a":1,}`, `[1,]`, `01`, `1.`, `.5`, `-`, `1e`, `"\x"`, `"\u12"`,
	"\"\x01\"", "\"é\xff\"", `{"a" 1}`, `{1:2}`, `[1 2]`, `tru`, `nul`, `{"a":1}x`, ``, ` `, `"abc`,
	`{"metadata":{"name":"p","Name":"q","generateName":"g"},"spec":{"containers":[{"name":"c"}]}}`,
	`{"metadata":{"name":42}}`, `{"metadata":[1]}`, `{"meta\u0064ata":{"name":"esc"}}`, `{"METADATA":{"NAME":"up"}}`,
	strings.Repeat("[", 10000) + strings.Repeat("]", 10000), strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000), strings.Repeat(`{"a":`, 10001) + "1" + strings.Repeat("}", 10001),
}

// FuzzScanValid checks the fast scanner against encoding/json (the same
// documents are valid) and the pruner against the API server's decoder:
// decoding a Prune result into a struct of the kept fields with
// jsonedit.Unmarshal gives what decoding the whole document gives, the
// case-sensitive key rule included ("Name", "METADATA" are not the fields).
func FuzzScanValid(f *testing.F) {
	for _, s := range scanSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, d []byte) {
		checkScan(t, d)
	})
}

func TestScanSeeds(t *testing.T) {
	for _, s := range scanSeeds {
		checkScan(t, []byte(s))
	}
}

type prunedNames struct {
	Metadata struct {
		Name         string `json:"name"`
		GenerateName string `json:"generateName"`
	} `json:"metadata"`
}

func checkScan(t *testing.T, d []byte) {
	t.Helper()
	if got, want := jsonscan.Valid(d), json.Valid(d); got != want {
		t.Fatalf("validJSON(%q) = %v, json.Valid = %v", trunc(d), got, want)
	}
	var full, part prunedNames
	errFull := jsonedit.Unmarshal(d, &full)
	_, errPart := DecodeFields(d, Keep{"metadata": {"name": nil, "generateName": nil}}, &part)
	if (errFull == nil) != (errPart == nil) || full != part {
		t.Fatalf("%q: whole decode %+v, %v; pruned decode %+v, %v", trunc(d), full, errFull, part, errPart)
	}
	if errFull != nil && errFull.Error() != errPart.Error() {
		t.Fatalf("%q: error %q, pruned %q", trunc(d), errFull, errPart)
	}
}

func trunc(d []byte) string {
	if len(d) > 80 {
		return string(d[:80]) + "..."
	}
	return string(d)
}

// TestDecodeFieldsIsCaseSensitive: member names that differ from a kept
// field only in case are not that field (the API server's rule), and an
// escaped name that unescapes to it is.
func TestDecodeFieldsIsCaseSensitive(t *testing.T) {
	for _, c := range []struct{ in, name string }{
		{`{"metadata":{"Name":"q","name":"p"}}`, "p"},
		{`{"metadata":{"name":"p","NAME":"q"}}`, "p"},
		{`{"Metadata":{"name":"q"}}`, ""},
		{`{"metadata":{"na\u006de":"e"}}`, "e"},
	} {
		var v prunedNames
		if _, err := DecodeFields([]byte(c.in), Keep{"metadata": {"name": nil}}, &v); err != nil || v.Metadata.Name != c.name {
			t.Errorf("%s: name %q, %v; want %q", c.in, v.Metadata.Name, err, c.name)
		}
	}
}
