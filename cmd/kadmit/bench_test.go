package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kadmit/kadmit/internal/cmdexit"
)

// TestBenchFlagModes: flags of one mode are refused in the other, and bad
// through-API-server input fails with exit status 2 before any network I/O.
func TestBenchFlagModes(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent.kubeconfig")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--url", "https://127.0.0.1:1/x", "--rate", "5"}, "--rate needs --through-apiserver"},
		{[]string{"--url", "https://127.0.0.1:1/x", "--namespace", "shop"}, "--namespace needs --through-apiserver"},
		{[]string{"--through-apiserver", "-c", "3"}, "--concurrency does not apply with --through-apiserver"},
		{[]string{"--through-apiserver", "--url", "https://127.0.0.1:1/x"}, "--url does not apply with --through-apiserver"},
		{[]string{"--through-apiserver", "--rate", "0"}, "--rate 0: must be 1..1000 creates per second"},
		{[]string{"--through-apiserver", "--rate", "1001", "--kubeconfig", missing}, "--rate 1001: must be 1..1000"},
		{[]string{"--through-apiserver", "-d", "0s"}, "-d 0s: must be 1s..10m0s"},
		{[]string{"--through-apiserver", "-d", "11m", "--kubeconfig", missing}, "-d 11m0s: must be 1s..10m0s"},
		{[]string{"--through-apiserver", "--max-in-flight", "0"}, "--max-in-flight 0: must be 1..1024"},
		{[]string{"--through-apiserver", "--kubeconfig", missing}, "no kubeconfig: --kubeconfig: stat " + missing},
		{[]string{}, "--url is required (or --through-apiserver)"},
		{[]string{"--url", "https://127.0.0.1:1/x", "--trace-receiver", "127.0.0.1:4317"}, "--trace-receiver needs --through-apiserver"},
		{[]string{"--through-apiserver", "--max-spans", "10"}, "--max-spans needs --trace-receiver"},
		{[]string{"--through-apiserver", "--trace-receiver", "0.0.0.0:4317", "--kubeconfig", missing}, `--trace-receiver "0.0.0.0:4317": want a loopback IP:PORT`},
		{[]string{"--through-apiserver", "--trace-receiver", "127.0.0.1:4317", "--max-spans", "0", "--kubeconfig", missing}, "--max-spans 0: must be 1..5000000"},
	}
	for _, c := range cases {
		cmd := newBenchCmd()
		cmd.SetArgs(c.args)
		var out, errb bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&errb)
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		err := cmd.ExecuteContext(context.Background())
		var ce *cmdexit.Error
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.As(err, &ce) || ce.Code != 2 {
			t.Errorf("%v: %v, want exit 2 with %q", c.args, err, c.want)
		}
	}
}
