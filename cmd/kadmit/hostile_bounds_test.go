package main

import "testing"

// TestServeBoundDefaults pins the defaults of `kadmit serve`'s bound flags
// to the figures docs/security.md's "Bounds" table states; the tests of
// each bound run with smaller values to stay fast.
func TestServeBoundDefaults(t *testing.T) {
	f := newServeCmd().Flags()
	for flag, want := range map[string]string{
		"read-timeout":                  "30s",
		"max-request-bytes":             "7340032", // 7 MiB
		"max-connections":               "512",
		"metrics-max-connections":       "64",
		"max-in-flight":                 "256",
		"max-body-bytes-in-flight":      "33554432", // 32 MiB
		"max-abandoned-reviews":         "16",
		"policy-max-object-bytes":       "1572864",  // 1.5 MiB
		"policy-decode-bytes-in-flight": "67108864", // 64 MiB
	} {
		fl := f.Lookup(flag)
		if fl == nil {
			t.Errorf("no --%s", flag)
			continue
		}
		if fl.DefValue != want {
			t.Errorf("--%s default %s, docs/security.md says %s", flag, fl.DefValue, want)
		}
	}
}
