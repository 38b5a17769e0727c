package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/kadmit/kadmit/test/netns"
)

// EnvRequired names the variable that turns "cannot start here" into a
// failure rather than a skip (make test sets it).
const EnvRequired = "KADMIT_E2E_REQUIRED"

// Inside reports whether this process runs in the namespaces Reexec made.
func Inside() bool { return netns.Inside() }

// Available returns nil when this machine can run a cluster's namespaces,
// else ErrUnavailable naming what is missing.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root (CI runs as root)", ErrUnavailable)
	}
	for _, bin := range []string{"unshare", "nsenter", "ip", "mount", "sysctl"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%w: %s not found (Debian packages util-linux, iproute2, mount, procps)", ErrUnavailable, bin)
		}
	}
	if out, err := exec.Command("unshare", "--net", "--mount", "--pid", "--fork", "--mount-proc", "true").CombinedOutput(); err != nil {
		return fmt.Errorf("%w: the kernel refuses network, mount or PID namespaces: unshare: %s", ErrUnavailable, strings.TrimSpace(string(out)))
	}
	if out, err := exec.Command("unshare", "--net", "sh", "-c", "ip link add kadmitprobe type veth peer name kadmitprobe1 && ip link add kadmitbr type bridge").CombinedOutput(); err != nil {
		return fmt.Errorf("%w: the kernel lacks veth or bridge devices: %s", ErrUnavailable, strings.TrimSpace(string(out)))
	}
	if _, err := cgroupHierarchies(); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return nil
}

// Reexec runs this process's binary again, with the same arguments, inside
// a new network and mount namespace with lo up, and returns its exit code.
// The mount namespace keeps the nodes' bind mounts and the bridge's sysctls
// off the host even if a test is killed.
func Reexec() (int, error) {
	if err := Available(); err != nil {
		return 0, err
	}
	return netns.ReexecWith("--mount", "--propagation", "private")
}

// Main is for TestMain and for programs (go run): outside the namespaces it
// re-executes the binary inside them and returns the exit code; inside it
// runs run. When the namespaces cannot be made it returns 1 with the reason
// if KADMIT_E2E_REQUIRED=1, else prints the reason and returns 0 (skip).
func Main(run func() int) int {
	if Inside() {
		return run()
	}
	code, err := Reexec()
	if err != nil {
		if os.Getenv(EnvRequired) == "1" {
			fmt.Fprintf(os.Stderr, "FAIL: %v (%s=1)\n", err, EnvRequired)
			return 1
		}
		fmt.Fprintf(os.Stderr, "SKIP: %v\n", err)
		return 0
	}
	return code
}
