package image

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kadmit/kadmit/test/controlplane"
)

// containerdConfig (containerd 2.4's layout, version 4: the servers'
// addresses are plugin settings, a top-level [grpc] is ignored) keeps
// every path of a throwaway containerd under dir and turns off the plugins
// that would reach outside it: CRI (CNI, a streaming port), NRI (/var/run/nri), opt (/opt/containerd) and the image
// verifier (/opt/containerd/image-verifier). Importing needs only the
// content, metadata, images, snapshotter, diff and transfer plugins.
const containerdConfig = `version = 4
root = %[1]q
state = %[2]q
temp = %[3]q
imports = []
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.cri.v1.images",
  "io.containerd.cri.v1.runtime",
  "io.containerd.podsandbox.controller.v1.podsandbox",
  "io.containerd.nri.v1.nri",
  "io.containerd.internal.v1.opt",
  "io.containerd.image-verifier.v1.bindir",
]

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = %[4]q
  [plugins.'io.containerd.server.v1.ttrpc']
    address = %[5]q
  [plugins.'io.containerd.server.v1.debug']
    address = ''
  [plugins.'io.containerd.server.v1.metrics']
    address = ''
`

// TestContainerdImport proves the naming the package documents: a real
// containerd (the one hack/controlplane.sh --node builds) imports the
// archives Write makes under exactly the reference written, into the
// k8s.io namespace the CRI plugin reads, while an unqualified name in an
// archive comes out rewritten under docker.io/library/.
func TestContainerdImport(t *testing.T) {
	if testing.Short() {
		t.Skip("starts containerd")
	}
	cp, err := controlplane.DefaultDir()
	if err != nil {
		t.Skip(err)
	}
	node := filepath.Join(cp, "node")
	containerd, ctr := filepath.Join(node, "containerd"), filepath.Join(node, "ctr")
	for _, p := range []string{containerd, ctr} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("%s: run hack/controlplane.sh --node (%v)", p, err)
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("containerd needs root (snapshotter mounts)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Short paths: a unix socket path is limited to 107 bytes.
	dir, err := os.MkdirTemp("", "kadmit-ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Logf("remove %s: %v", dir, err)
		}
	})
	sock := filepath.Join(dir, "c.sock")
	conf := filepath.Join(dir, "config.toml")
	cfg := fmt.Sprintf(containerdConfig, filepath.Join(dir, "root"), filepath.Join(dir, "state"),
		filepath.Join(dir, "tmp"), sock, sock+".ttrpc")
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	d := exec.Command(containerd, "--config", conf, "--log-level", "warn")
	d.Stdout, d.Stderr = &logs, &logs
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.Wait() }()
	t.Cleanup(func() {
		// By PID: this containerd only, never one that a cluster runs.
		d.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			d.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("containerd log:\n%s", logs.String())
		}
	})

	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, ctr, append([]string{"--address", sock, "--namespace", CRINamespace}, args...)...)
		// stdout only: ctr warns on stderr (cgroup v1 deprecation, say).
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("ctr %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
		}
		return string(out)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err := exec.CommandContext(ctx, ctr, "--address", sock, "version").Run(); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("containerd exited: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd not serving on %s\n%s", sock, logs.String())
		}
	}

	pause, err := Pause(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// The contrast: what containerd does to a name that is not qualified.
	bare := filepath.Join(t.TempDir(), "bare.tar")
	img, err := tarball.ImageFromPath(pause, nil)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag("kadmit-bare:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(bare, tag, img); err != nil {
		t.Fatal(err)
	}

	if err := Import(ctx, ctr, sock, pause, bare); err != nil {
		t.Fatal(err)
	}
	names := strings.Fields(run("images", "ls", "-q"))
	if !slices.Contains(names, PauseRef) {
		t.Errorf("containerd names %q, want %q among them", names, PauseRef)
	}
	if !slices.Contains(names, "docker.io/library/kadmit-bare:1") {
		t.Errorf("containerd names %q: an unqualified name was not normalised as documented", names)
	}
	if len(names) != 2 {
		t.Errorf("containerd names %q, want exactly the two imported", names)
	}
	// Unpacked for the default snapshotter: a container could start from it.
	if out := run("images", "check"); !strings.Contains(out, PauseRef) || !strings.Contains(out, "complete") {
		t.Errorf("ctr images check:\n%s", out)
	}
}
