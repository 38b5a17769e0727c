//go:build !linux

package kadmitproc

import "os/exec"

// setParentDeathSignal has no portable equivalent outside Linux; there the
// caller's Terminate is the only cleanup.
func setParentDeathSignal(*exec.Cmd) {}
