package harness

import (
	"testing"
	"time"
)

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

func TestParseStatCPU(t *testing.T) {
	// A command with a space and a parenthesis, utime 150 and stime 50 ticks.
	stat := "4242 (kad) mit) S 1 4242 4242 0 -1 4194560 2000 0 0 0 150 50 0 0 20 0 8 0 100 0 0"
	got, err := parseStatCPU(stat)
	if err != nil || got != 2*time.Second {
		t.Fatalf("parseStatCPU = %v, %v; want 2s", got, err)
	}
	if _, err := parseStatCPU("4242 (short) S 1"); err == nil {
		t.Fatal("want an error for a truncated stat line")
	}
}
