package jsonscan

import (
	"encoding/json"
	"strings"
	"testing"
)

var scanSeeds = []string{
	`{}`, `[]`, `null`, `true`, `false`, `0`, `-0`, `1.5e-3`, `-12E+2`, `"a\"b\\c\/\b\f\n\r\t\u00e9"`,
	` {"a" : [1, 2, {"b": null}] } `, `{"a":1,}`, `[1,]`, `01`, `1.`, `.5`, `-`, `1e`, `"\x"`, `"\u12"`,
	"\"\x01\"", "\"é\xff\"", `{"a" 1}`, `{1:2}`, `[1 2]`, `tru`, `nul`, `{"a":1}x`, ``, ` `, `"abc`,
	strings.Repeat("[", 10000) + strings.Repeat("]", 10000), strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000), strings.Repeat(`{"a":`, 10001) + "1" + strings.Repeat("}", 10001),
}

// FuzzValid checks the scanner accepts exactly what json.Valid accepts.
func FuzzValid(f *testing.F) {
	for _, s := range scanSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, d []byte) {
		if got, want := Valid(d), json.Valid(d); got != want {
			t.Fatalf("Valid(%q) = %v, json.Valid = %v", d, got, want)
		}
	})
}

func TestValidSeeds(t *testing.T) {
	for _, s := range scanSeeds {
		if got, want := Valid([]byte(s)), json.Valid([]byte(s)); got != want {
			t.Errorf("Valid(%.40q) = %v, json.Valid = %v", s, got, want)
		}
	}
}
