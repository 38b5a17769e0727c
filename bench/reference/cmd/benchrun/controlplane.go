package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// errNoControlPlane is returned by startControlPlane when kube-apiserver or
// etcd is not in the directory (build them with `make controlplane`).
var errNoControlPlane = errors.New("control plane binaries missing")

// defaultControlPlaneDir is where hack/controlplane.sh builds the binaries:
// $KADMIT_CONTROLPLANE_DIR, else ~/.cache/kadmit/controlplane/v1.37.1 (as
// test/controlplane's DefaultDir).
func defaultControlPlaneDir() string {
	if d := os.Getenv("KADMIT_CONTROLPLANE_DIR"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".cache", "kadmit", "controlplane", "v1.37.1")
}

// startControlPlane starts etcd and kube-apiserver from dir on loopback
// (envtest, as test/controlplane does; that package is in another module),
// writes an admin kubeconfig to kubeconfig (mode 0600) and returns the
// function that stops both. `kadmit serve --policies` needs a cluster: the
// declared policies' namespaceSelector and namespaceObject read namespaces
// from its informer (internal/serve/reload.go). The API server idles while
// kadmit is measured: nothing is created.
func startControlPlane(ctx context.Context, dir, kubeconfig string, out io.Writer) (stop func(), err error) {
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return nil, fmt.Errorf("%w: %v", errNoControlPlane, err)
		}
	}
	apiPort, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}
	etcdPort, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}
	api := &envtest.APIServer{
		SecureServing: envtest.SecureServing{ListenAddr: envtest.ListenAddr{Address: "127.0.0.1", Port: strconv.Itoa(apiPort)}},
		Out:           out, Err: out,
		Path: filepath.Join(dir, "kube-apiserver"),
	}
	etcd := &envtest.Etcd{Out: out, Err: out, Path: filepath.Join(dir, "etcd")}
	etcd.URL = &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(etcdPort))}
	env := &envtest.Environment{
		BinaryAssetsDirectory:    dir,
		ControlPlane:             envtest.ControlPlane{APIServer: api, Etcd: etcd},
		ControlPlaneStartTimeout: 90 * time.Second,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	// envtest.Start takes no context; it bounds itself by the start timeout.
	started := make(chan error, 1)
	go func() {
		_, err := env.Start()
		started <- err
	}()
	select {
	case err = <-started:
	case <-ctx.Done():
		<-started
		err = ctx.Err()
	}
	stop = func() { _ = env.Stop() }
	if err != nil {
		stop()
		return nil, fmt.Errorf("start kube-apiserver and etcd from %s: %w", dir, err)
	}
	user, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err == nil {
		var kc []byte
		if kc, err = user.KubeConfig(); err == nil {
			err = os.WriteFile(kubeconfig, kc, 0o600)
		}
	}
	if err != nil {
		stop()
		return nil, fmt.Errorf("admin kubeconfig: %w", err)
	}
	return stop, nil
}

func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
