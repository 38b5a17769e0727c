// Command cpup starts the test control plane, writes its kubeconfig and
// waits for SIGINT/SIGTERM: for trying kadmit by hand against a real API server.
//
//	make controlplane                 # once: builds kube-apiserver and etcd
//	cd test && go run ./cmd/cpup [-out /tmp/kadmit-dev.kubeconfig]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kadmit/kadmit/test/controlplane"
)

func main() {
	kubeconfig := flag.String("out", "/tmp/kadmit-dev.kubeconfig", "where to write the kubeconfig")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cpup:", err)
		os.Exit(1)
	}
	defer cp.Stop()
	if err := cp.WriteKubeconfig(*kubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, "cpup:", err)
		os.Exit(1)
	}
	fmt.Printf("control plane up; KUBECONFIG=%s\n", *kubeconfig)
	<-ctx.Done()
}
