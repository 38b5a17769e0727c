package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestServeDecisionLog: through `kadmit serve` itself, by default 60
// allowed reviews in a burst give the per-webhook burst of 10 lines (10
// more for each second the run straddles) while all 5 denials are logged and
// kadmit_admission_requests_total counts all 65; with --log-level debug or
// --log-allowed-sample=1 every allowed review gets its line.
func TestServeDecisionLog(t *testing.T) {
	if external != "" {
		t.Skip("the decision log flags are this commit's")
	}
	for _, tc := range []struct {
		name     string
		args     []string
		min, max int
	}{
		{"default", nil, 10, -1}, // -1: 10 per second started
		{"debug", []string{"--log-level=debug"}, 60, 60},
		{"sample 1", []string{"--log-allowed-sample=1"}, 60, 60},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startKadmit(t, 5*time.Second, tc.args...)
			c := p.client()
			post := func(uid, name string) {
				resp, err := c.Post("https://"+p.addr+"/validate-pod", "application/json", strings.NewReader(string(podReview(uid, name, "CREATE"))))
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("HTTP %d", resp.StatusCode)
				}
			}
			start := time.Now()
			for i := 0; i < 60; i++ {
				post(fmt.Sprintf("a%d", i), fmt.Sprintf("ok-%d", i))
				if i%12 == 0 {
					post(fmt.Sprintf("d%d", i), fmt.Sprintf("offensive-%d", i))
				}
			}
			most := tc.max
			if most < 0 {
				most = 10 * (int(time.Since(start)/time.Second) + 2)
			}
			time.Sleep(300 * time.Millisecond) // the log writer flushes every 100 ms
			f, err := os.Open(p.logPath)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			allowed, denied, sampled := 0, 0, 0
			sc := bufio.NewScanner(f)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				l := sc.Text()
				if !strings.Contains(l, `"msg":"admission decision"`) || !strings.Contains(l, `"webhook":"/validate-pod"`) {
					continue
				}
				switch {
				case strings.Contains(l, `"allowed":true`):
					allowed++
				case strings.Contains(l, `"allowed":false`):
					denied++
				}
				if strings.Contains(l, `"sampled"`) {
					sampled++
				}
			}
			if allowed < tc.min || allowed > most || denied != 5 || sampled != 0 {
				t.Fatalf("%d allowed lines (want %d..%d), %d denied (want 5), %d sampled (want 0)", allowed, tc.min, most, denied, sampled)
			}
			counted := 0
			for _, l := range strings.Split(p.metricsText(), "\n") {
				if strings.HasPrefix(l, `kadmit_admission_requests_total{`) && strings.Contains(l, `webhook="/validate-pod"`) {
					v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
					if err != nil {
						t.Fatalf("%q: %v", l, err)
					}
					counted += int(v)
				}
			}
			if counted != 65 {
				t.Fatalf("kadmit_admission_requests_total counts %d /validate-pod reviews, want all 65", counted)
			}
			t.Logf("%d allowed and %d denied lines for 60 allowed and 5 denied reviews; metrics count %d", allowed, denied, counted)
		})
	}
}
