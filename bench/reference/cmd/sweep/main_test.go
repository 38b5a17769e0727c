package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

func TestPaddedPodSize(t *testing.T) {
	for _, size := range []int{1 << 10, 10 << 10, 1 << 20} {
		file, err := paddedPod(t.TempDir(), size)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != size || !json.Valid(b) {
			t.Errorf("size %d: got %d bytes, valid JSON %v", size, len(b), json.Valid(b))
		}
	}
}

func TestColocationConfig(t *testing.T) {
	if c := colocationConfig(0, true); !strings.Contains(c, "enabled: false") || strings.Contains(c, "name:") {
		t.Errorf("N=0 is not the seed profile:\n%s", c)
	}
	all, none := colocationConfig(50, true), colocationConfig(50, false)
	if n := strings.Count(all, "- name: p"); n != 50 {
		t.Errorf("%d profiles, want 50", n)
	}
	if strings.Count(all, "team: payments") != 50 || strings.Contains(none, "team: payments") {
		t.Error("match selectors wrong")
	}
}
