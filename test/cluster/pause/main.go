// Command pause is the test cluster's pod sandbox program (containerd's
// sandbox image, kadmit.test/pause:1) and the holder process that keeps a
// namespace alive: it does nothing but wait for SIGTERM or SIGINT, then
// exits 0.
//
// As PID 1 of a pod it must reap the zombies of processes whose parent
// died (a pod sharing its PID namespace re-parents orphans to it). Outside
// a PID namespace it marks itself a child subreaper, so orphans of its own
// descendants come to it rather than to the host's init, and reaps them
// too. It is static (CGO_ENABLED=0) so it runs in an image with no libc.
//
//	pause [-ready-file path]
//
// -ready-file is written (empty) once the signal handlers are installed:
// a parent that waits for the file knows a SIGTERM from then on ends the
// holder cleanly instead of killing it by default disposition.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	ready := flag.String("ready-file", "", "write this file once signal handlers are installed")
	flag.Parse()

	// Subscribe before anything else so no SIGCHLD or SIGTERM is missed.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)

	// A subreaper inherits orphaned descendants; as PID 1 this is implied,
	// elsewhere it makes a holder behave like one. Failure is not fatal:
	// the holder still holds its namespace.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "pause: PR_SET_CHILD_SUBREAPER:", err)
	}

	if *ready != "" {
		if err := os.WriteFile(*ready, nil, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "pause: ready file:", err)
			os.Exit(1)
		}
	}

	reap() // children that died before the handler was in place
	for s := range sigs {
		if s == syscall.SIGCHLD {
			reap()
			continue
		}
		os.Exit(0) // SIGTERM or SIGINT
	}
}

// reap collects every exited child without blocking. Signals coalesce, so
// one SIGCHLD may stand for many exits: loop until none is left.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return // 0: children but none exited; ECHILD: no children
		}
	}
}
