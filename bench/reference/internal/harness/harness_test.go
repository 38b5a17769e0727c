package harness

import "testing"

func TestTailWriter(t *testing.T) {
	w := &TailWriter{Max: 4}
	for _, s := range []string{"ab", "cdef", "g"} {
		if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatal(n, err)
		}
	}
	if got := string(w.Bytes()); got != "defg" {
		t.Errorf("kept %q, want %q", got, "defg")
	}
}

func TestPinned(t *testing.T) {
	if got := Pinned(false, 1, []string{"a"}); len(got) != 1 {
		t.Errorf("unpinned: %v", got)
	}
	if got := Pinned(true, 1, []string{"a"}); len(got) != 4 || got[0] != "taskset" || got[2] != "1" {
		t.Errorf("pinned: %v", got)
	}
}
