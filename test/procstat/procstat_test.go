package procstat

import (
	"os"
	"testing"
	"time"
)

func TestStatusOfThisProcess(t *testing.T) {
	peak, err := Status(os.Getpid(), "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	rss, err := Status(os.Getpid(), "VmRSS")
	if err != nil {
		t.Fatal(err)
	}
	// Both are counted in pages, and the kernel updates the high-water
	// mark lazily: VmHWM may trail VmRSS by a little.
	if rss < 1<<20 || peak < 1<<20 {
		t.Errorf("VmRSS %d, VmHWM %d: want both at least 1 MiB (a Go test binary)", rss, peak)
	}
	if _, err := Status(os.Getpid(), "NoSuchField"); err == nil {
		t.Error("a missing field: no error")
	}
}

func TestCPUGrowsWithWork(t *testing.T) {
	c0, err := CPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Spin until the counter moves (ticks are 10 ms), bounded at 5 s.
	deadline := time.Now().Add(5 * time.Second)
	x := 0
	for time.Now().Before(deadline) {
		for i := range 1_000_000 {
			x += i
		}
		c1, err := CPU(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if c1 > c0 {
			return
		}
	}
	t.Errorf("CPU time stayed %s after 5 s of spinning (%d)", c0, x)
}
