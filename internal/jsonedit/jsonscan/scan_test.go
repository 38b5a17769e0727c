package jsonscan

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/fixture"
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

// TestSpecialFindsFirstByte checks the word-at-a-time test against a byte
// loop: for every byte value at every position of the word, with every
// byte value before it plain and arbitrary bytes after it, the lowest flag
// is the first byte that is '"', '\\' or a control character.
func TestSpecialFindsFirstByte(t *testing.T) {
	isSpecial := func(c byte) bool { return c == '"' || c == '\\' || c < 0x20 }
	for pos := 0; pos < 8; pos++ {
		for c := 0; c < 256; c++ {
			for _, after := range []byte{0x00, 0x1f, '"', '\\', 'a', 0x7f, 0x80, 0xff} {
				var w [8]byte
				for k := range w {
					switch {
					case k < pos:
						w[k] = byte(0x20 + (k*37+c)%0xe0) // plain bytes, 0x20..0xff but '"' and '\\'
						if isSpecial(w[k]) {
							w[k] = 'x'
						}
					case k == pos:
						w[k] = byte(c)
					default:
						w[k] = after
					}
				}
				want := -1
				for k, b := range w {
					if isSpecial(b) {
						want = k
						break
					}
				}
				m := special(uint64(w[0]) | uint64(w[1])<<8 | uint64(w[2])<<16 | uint64(w[3])<<24 |
					uint64(w[4])<<32 | uint64(w[5])<<40 | uint64(w[6])<<48 | uint64(w[7])<<56)
				got := -1
				if m != 0 {
					got = 0
					for m&0x80 == 0 {
						m >>= 8
						got++
					}
				}
				if got != want {
					t.Fatalf("special(% x) flags byte %d first, want %d", w, got, want)
				}
			}
		}
	}
}

// TestScanStringLong checks strings longer than a word, with the byte that
// ends or breaks them at every offset, against json.Valid.
func TestScanStringLong(t *testing.T) {
	for n := 0; n < 40; n++ {
		for _, c := range []string{`"`, `\"`, `\\`, `\u00e9`, `\x`, "\x01", "\x1f", "é", "\xff", `\u12`} {
			s := `"` + strings.Repeat("a", n) + c + strings.Repeat("b", 11) + `"`
			got := ScanString([]byte(s), 0)
			valid := json.Valid([]byte(s))
			if valid != (got == len(s)) && !(c == `"` && got == n+2) {
				t.Errorf("ScanString(%q) = %d, json.Valid = %v", s, got, valid)
			}
		}
	}
}

// BenchmarkValidPod scans `kadmit bench`'s Deployment pod (about 4.6 KB):
// go test -run '^$' -bench ValidPod ./internal/jsonedit/jsonscan
func BenchmarkValidPod(b *testing.B) {
	pod := fixture.DeploymentPodJSON()
	b.SetBytes(int64(len(pod)))
	for b.Loop() {
		if !Valid(pod) {
			b.Fatal("invalid")
		}
	}
}
