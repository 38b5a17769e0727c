package jsonscan

import "testing"

// TestMembersStops: a negative return from member stops the walk, and the
// walk reports -1; nil member skips values as ScanValue does.
func TestMembersStops(t *testing.T) {
	d := []byte(`{"a":1,"b":2}`)
	n := 0
	if end := Members(d, 0, 0, func(ks, ke, vs int) int { n++; return -1 }); end != -1 || n != 1 {
		t.Fatalf("end %d after %d members", end, n)
	}
	if end := Members(d, 0, 0, nil); end != len(d) {
		t.Fatalf("nil member: end %d, want %d", end, len(d))
	}
	var keys []string
	Members(d, 0, 0, func(ks, ke, vs int) int {
		keys = append(keys, string(d[ks:ke]))
		return ScanValue(d, vs, 1)
	})
	if len(keys) != 2 || keys[0] != `"a"` || keys[1] != `"b"` {
		t.Fatalf("keys %q", keys)
	}
	if Members(d, 0, MaxDepth, nil) != -1 || Elements([]byte(`[]`), 0, MaxDepth, nil) != -1 {
		t.Fatal("a container at MaxDepth is accepted")
	}
}
