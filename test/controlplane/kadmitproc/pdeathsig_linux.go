package kadmitproc

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal makes the kernel send kadmit SIGTERM if the test or
// demo process dies without running its cleanup (a panic, SIGKILL, a go test
// timeout), so no kadmit outlives it.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
