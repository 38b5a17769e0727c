// Package version holds kadmit's build version, set at link time:
//
//	-ldflags "-X github.com/kadmit/kadmit/internal/version.Version=v0.1.0 -X ...Commit=abc123"
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version and Commit are set with -ldflags -X; "dev" and "" otherwise.
var (
	Version = "dev"
	Commit  = ""
)

// String is the one-line version report `kadmit version` prints.
func String() string {
	commit := Commit
	if commit == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" {
					commit = s.Value
				}
			}
		}
	}
	if commit == "" {
		commit = "unknown"
	}
	return fmt.Sprintf("kadmit %s (commit %s, %s, %s/%s)", Version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
