package jsonedit

import (
	"testing"

	"github.com/kadmit/kadmit/internal/fixture"
	"github.com/kadmit/kadmit/internal/jsonedit/jsonscan"
)

// BenchmarkScanIndexedPod is the envelope's scan of `kadmit bench`'s pod
// (about 4.6 KB), with the Index and its extents, next to the plain scan:
// go test -run '^$' -bench 'Pod$' ./internal/jsonedit
func BenchmarkScanIndexedPod(b *testing.B) {
	pod := fixture.DeploymentPodJSON()
	b.SetBytes(int64(len(pod)))
	var ix Index
	for b.Loop() {
		if ScanIndexed(pod, 0, 0, &ix) != len(pod) {
			b.Fatal("invalid")
		}
	}
}

func BenchmarkScanValuePod(b *testing.B) {
	pod := fixture.DeploymentPodJSON()
	b.SetBytes(int64(len(pod)))
	for b.Loop() {
		if jsonscan.ScanValue(pod, 0, 0) != len(pod) {
			b.Fatal("invalid")
		}
	}
}
