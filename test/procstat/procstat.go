// Package procstat reads a process's memory and CPU figures from Linux's
// /proc, for the e2e suites that bound kadmit's peak RSS and CPU (issue 20).
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Status is one kB field of /proc/<pid>/status (field without its colon,
// e.g. "VmHWM", the peak resident set size, or "VmRSS"), in bytes. It
// fails when the process is gone or the field is missing or not a number.
func Status(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("procstat: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field+":" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("procstat: %s in /proc/%d/status: %w", field, pid, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("procstat: no %s in /proc/%d/status", field, pid)
}

// CPU is the process's user plus system CPU time (utime and stime of
// /proc/<pid>/stat, proc(5)), in clock ticks of USER_HZ 100.
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("procstat: %w", err)
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// fields are counted after its closing one, from field 3 (state).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return 0, fmt.Errorf("procstat: /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("procstat: /proc/%d/stat: %d fields after the command name, want at least 13", pid, len(f))
	}
	ut, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("procstat: utime in /proc/%d/stat: %w", pid, err)
	}
	st, err := strconv.ParseInt(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("procstat: stime in /proc/%d/stat: %w", pid, err)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}
