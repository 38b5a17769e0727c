// Package netns runs a test binary inside a private network namespace, where
// it may put addresses from 198.18.0.0/15 on the loopback device and route
// the API server's webhook calls through a Service and its EndpointSlices to
// them, without any traffic leaving the machine.
package netns

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
)

// envMarker is set in the re-executed process, inside the namespace.
const envMarker = "KADMIT_IN_PRIVATE_NETNS"

// ErrUnavailable is returned when a private network namespace cannot be made
// here (not root, no unshare or ip command, or the kernel refuses).
var ErrUnavailable = errors.New("private network namespace unavailable")

// Inside reports whether this process runs in the namespace Reexec made.
func Inside() bool { return os.Getenv(envMarker) == "1" }

// Reexec runs this process's binary again with the same arguments inside a
// new network namespace (unshare --net), with lo up, and returns its exit
// code. Call it from TestMain when !Inside(). It returns ErrUnavailable
// (wrapped, with the reason) when the namespace cannot be created.
func Reexec() (int, error) {
	if err := Available(); err != nil {
		return 0, err
	}
	return ReexecWith()
}

// ReexecWith is Reexec without the availability check, with more unshare
// flags (e.g. "--mount", "--propagation", "private" for the real cluster's
// bind mounts); the caller checks what its namespaces need.
func ReexecWith(unshareFlags ...string) (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	args := append(append([]string{"--net"}, unshareFlags...), "--", "sh", "-c", `ip link set lo up && exec "$@"`, "sh", exe)
	args = append(args, os.Args[1:]...)
	cmd := exec.Command("unshare", args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), envMarker+"=1")
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	if err != nil {
		return 0, fmt.Errorf("run inside a private network namespace: %w", err)
	}
	return 0, nil
}

// Available returns nil when Reexec can work, else ErrUnavailable with why.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root (CI runs as root)", ErrUnavailable)
	}
	for _, bin := range []string{"unshare", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%w: %s not found (Debian packages util-linux and iproute2)", ErrUnavailable, bin)
		}
	}
	if out, err := exec.Command("unshare", "--net", "true").CombinedOutput(); err != nil {
		return fmt.Errorf("%w: unshare --net: %s", ErrUnavailable, strings.TrimSpace(string(out)))
	}
	return nil
}

// testNet is the range tests may put on lo: 198.18.0.0/15 (RFC 2544),
// reserved for benchmarking and never routed on the internet.
var testNet = &net.IPNet{IP: net.IPv4(198, 18, 0, 0), Mask: net.CIDRMask(15, 32)}

// AddLoopbackAddr puts ip (from 198.18.0.0/15) on lo. It refuses to run
// outside the namespace Reexec made, so a test can never change the host's
// network, and refuses addresses outside the test range.
func AddLoopbackAddr(ip string) error {
	if !Inside() {
		return fmt.Errorf("%w: refusing to add %s to lo outside a private network namespace", ErrUnavailable, ip)
	}
	parsed := net.ParseIP(ip)
	if parsed == nil || !testNet.Contains(parsed) {
		return fmt.Errorf("address %q is not in 198.18.0.0/15", ip)
	}
	out, err := exec.Command("ip", "addr", "add", ip+"/32", "dev", "lo").CombinedOutput()
	if err != nil && !strings.Contains(string(out), "File exists") {
		return fmt.Errorf("ip addr add %s dev lo: %s: %w", ip, strings.TrimSpace(string(out)), err)
	}
	return nil
}
