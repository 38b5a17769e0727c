package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kadmit/kadmit/test/poll"
)

// Node is one kubelet with its own containerd, root directory, mount
// namespace and PID namespace; every node but the first also has its own
// network namespace, joined to the first's by a veth pair on a bridge. The
// first node shares the network namespace of the control plane (and of the
// test process), as a kind control-plane node does.
type Node struct {
	// Name is the Node object's name (node1, node2, ...).
	Name string
	// IP is the node's InternalIP, in 198.18.0.0/24.
	IP string
	// PodCIDR is the node's pod range, 10.244.<i>.0/24.
	PodCIDR string
	// Dir holds the node's configuration, state and logs.
	Dir string

	index   int
	c       *Cluster
	holder  *proc // unshare --kill-child; holder.pid is the namespaces' init
	cgroup  string
	ctrd    *proc
	kubelet *proc
	proxy   *proc
	down    bool // Stop ended it on purpose
}

// Socket is the node's containerd socket, reachable from the test process.
func (n *Node) Socket() string { return filepath.Join(n.Dir, "containerd.sock") }

// sysctlsKubeletWants are the host-wide sysctls kubelet checks at start and
// rewrites when they differ (pkg/kubelet/cm/container_manager_linux.go,
// setupKernelTunables, v1.37.1). They are not namespaced, so inside the
// node's mount namespace a file holding the wanted value is bind-mounted over
// each: kubelet reads what it wants, and a write lands in the file, never in
// the host's kernel.
var sysctlsKubeletWants = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// startHolder starts the process that holds the node's namespaces: a new
// mount and PID namespace (and network namespace for every node but the
// first) whose init is the pause reaper. Its death ends every process in the
// PID namespace, which is what makes teardown bounded whatever containerd's
// shims and the containers did.
func (n *Node) startHolder(ctx context.Context) error {
	args := []string{"unshare", "--kill-child", "--pid", "--mount", "--propagation", "private", "--mount-proc"}
	if n.index > 0 {
		args = append(args, "--net")
	}
	args = append(args, "--", n.c.pause)
	p, err := startProc(n.c.logDir, n.Name+"-holder", args, nil)
	if err != nil {
		return err
	}
	init, err := childOf(p.pid, 10*time.Second)
	if err != nil {
		p.stop(time.Second)
		return fmt.Errorf("cluster: %s namespace holder: %w\n%s", n.Name, err, p.tail(20))
	}
	// The holder's pid is its init's, so nsenter -t finds the namespaces and
	// stop kills the init (SIGTERM: pause exits, the kernel kills the rest).
	p.pid = init
	n.holder = p

	// Fixed paths kubelet, containerd, runc and the CNI plugins use
	// (/var/lib/kubelet's neighbours, /var/log/containers, /run/runc,
	// /var/lib/cni, /run/xtables.lock) land under the node's directory.
	for _, m := range []string{"/run", "/var/lib", "/var/log"} {
		src := filepath.Join(n.Dir, "fs", strings.ReplaceAll(strings.TrimPrefix(m, "/"), "/", "-"))
		if err := os.MkdirAll(src, 0o755); err != nil {
			return fmt.Errorf("cluster: %s: %w", n.Name, err)
		}
		if _, err := n.nsenter(ctx, "mount", "--bind", src, m); err != nil {
			return err
		}
	}
	for key, val := range sysctlsKubeletWants {
		file := filepath.Join(n.Dir, "sysctl", strings.ReplaceAll(key, "/", "."))
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			return fmt.Errorf("cluster: %s: %w", n.Name, err)
		}
		if err := os.WriteFile(file, []byte(val+"\n"), 0o644); err != nil {
			return fmt.Errorf("cluster: %s: %w", n.Name, err)
		}
		if _, err := n.nsenter(ctx, "mount", "--bind", file, "/proc/sys/"+key); err != nil {
			return err
		}
	}
	return nil
}

// nsenter runs a short command inside the node's namespaces.
func (n *Node) nsenter(ctx context.Context, argv ...string) (string, error) {
	return run(ctx, append(n.enter(), argv...)...)
}

// enter is the nsenter prefix that runs a command in the node's namespaces.
func (n *Node) enter() []string {
	args := []string{"nsenter", "-t", strconv.Itoa(n.holder.pid), "--mount", "--pid"}
	if n.index > 0 {
		args = append(args, "--net")
	}
	return append(args, "--")
}

// startInNode starts a long-running component inside the node's namespaces.
func (n *Node) startInNode(name string, argv ...string) (*proc, error) {
	p, err := startProc(n.c.logDir, n.Name+"-"+name, append(n.enter(), argv...), nil)
	if err != nil {
		return nil, err
	}
	pid, err := childOf(p.pid, 10*time.Second)
	if err != nil {
		p.stop(time.Second)
		return nil, fmt.Errorf("cluster: %s %s: %w\n%s", n.Name, name, err, p.tail(20))
	}
	p.pid = pid
	return p, nil
}

// cgroupHierarchies are the mounted cgroup v1 hierarchies kubelet and runc
// use; cgroup v2 (unified) is left to the host.
func cgroupHierarchies() ([]string, error) {
	entries, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cluster: read /sys/fs/cgroup: %w", err)
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() || e.Name() == "unified" {
			continue
		}
		dir := filepath.Join("/sys/fs/cgroup", e.Name())
		var st syscall.Statfs_t
		if syscall.Statfs(dir, &st) == nil && st.Type == 0x27e0eb { // CGROUP_SUPER_MAGIC
			out = append(out, dir)
		}
	}
	return out, nil
}

// makeCgroup creates the node's cgroupRoot in every v1 hierarchy. cpuset
// needs cpus and mems before a task can join; they are copied from the
// parent as the kernel does not inherit them on v1.
func (n *Node) makeCgroup() error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	if len(hs) == 0 {
		return fmt.Errorf("%w: no cgroup v1 hierarchy under /sys/fs/cgroup (this cluster is set up for cgroup v1 hybrid hosts)", ErrUnavailable)
	}
	for _, h := range hs {
		dir := filepath.Join(h, n.cgroup)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("%w: create cgroup %s: %v", ErrUnavailable, dir, err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return fmt.Errorf("cluster: %w", err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					return fmt.Errorf("cluster: %s: %w", f, err)
				}
			}
		}
	}
	return nil
}

// removeCgroup removes the node's cgroup trees depth-first; a cgroup still
// holding a task (a process the kernel has not finished killing) is retried
// for a few seconds.
func (n *Node) removeCgroup() {
	if n.cgroup == "" {
		return
	}
	hs, _ := cgroupHierarchies()
	// kubelet and runc on a hybrid host also mirror the tree in cgroup2.
	hs = append(hs, "/sys/fs/cgroup/unified")
	deadline := time.Now().Add(5 * time.Second)
	for _, h := range hs {
		root := filepath.Join(h, n.cgroup)
		for {
			var dirs []string
			_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			failed := false
			for i := len(dirs) - 1; i >= 0; i-- {
				if err := syscall.Rmdir(dirs[i]); err != nil && !os.IsNotExist(err) {
					failed = true
				}
			}
			if !failed || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func (n *Node) writeFiles() error {
	c := n.c
	for _, d := range []string{"containerd/root", "containerd/state", "containerd/tmp", "containerd/verifiers", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", "volume-plugins"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	containerd := fmt.Sprintf(`# containerd 2.4's configuration layout (version 4): every path under the
# node's directory, no imports from /etc, NRI and the cgo snapshotters off.
version = 4
root = %[1]q
state = %[2]q
temp = %[9]q
imports = []
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs", "io.containerd.mount-handler.v1.erofs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = %[3]q
  [plugins.'io.containerd.server.v1.ttrpc']
    address = %[4]q
  [plugins.'io.containerd.server.v1.debug']
    address = ''
  [plugins.'io.containerd.server.v1.metrics']
    address = ''
  [plugins.'io.containerd.internal.v1.opt']
    path = %[8]q
  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = %[10]q

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    disable_pause_image_pull = true
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = %[5]q

  [plugins.'io.containerd.cri.v1.runtime']
    # runc sets -998 on the sandbox's oom_score_adj; root here lacks
    # CAP_SYS_RESOURCE to lower a score, so containerd clamps it instead.
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    enable_cdi = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = %[6]q
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["/usr/lib/cni"]
      conf_dir = %[7]q
      max_conf_num = 1

  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
`, filepath.Join(n.Dir, "containerd/root"), filepath.Join(n.Dir, "containerd/state"), n.Socket(),
		filepath.Join(n.Dir, "containerd.ttrpc.sock"), PauseRef, c.runc, filepath.Join(n.Dir, "cni/net.d"),
		filepath.Join(n.Dir, "containerd/opt"), filepath.Join(n.Dir, "containerd/tmp"), filepath.Join(n.Dir, "containerd/verifiers"))
	if err := os.WriteFile(filepath.Join(n.Dir, "containerd.toml"), []byte(containerd), 0o644); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}

	cni := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "kadmit-test",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, filepath.Join(n.Dir, "cni/ipam"), n.PodCIDR)
	if err := os.WriteFile(filepath.Join(n.Dir, "cni/net.d/10-kadmit-test.conflist"), []byte(cni), 0o644); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if err := os.WriteFile(filepath.Join(n.Dir, "resolv.conf"), []byte("nameserver 127.0.0.1\noptions ndots:1\n"), 0o644); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}

	servingCert, servingKey, err := c.pki.issue(n.Name+"-kubelet-serving", n.Name, nil, []net.IP{net.ParseIP(n.IP)}, []string{n.Name})
	if err != nil {
		return err
	}
	kubelet := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[2]d
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %[3]q}
authorization:
  mode: AlwaysAllow
tlsCertFile: %[4]q
tlsPrivateKeyFile: %[5]q
containerRuntimeEndpoint: unix://%[6]s
cgroupDriver: cgroupfs
cgroupRoot: %[7]q
failCgroupV1: false
failSwapOn: false
protectKernelDefaults: false
podLogsDir: %[8]q
volumePluginDir: %[9]q
resolvConf: %[10]q
clusterDomain: cluster.local
staticPodPath: ""
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
rotateCertificates: false
serverTLSBootstrap: false
`, n.IP, 10248+n.index, c.pki.CAFile, servingCert, servingKey, n.Socket(), n.cgroup,
		filepath.Join(n.Dir, "pod-logs"), filepath.Join(n.Dir, "volume-plugins"), filepath.Join(n.Dir, "resolv.conf"))
	if err := os.WriteFile(filepath.Join(n.Dir, "kubelet.yaml"), []byte(kubelet), 0o644); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}

	kubeletKubeconfig, err := c.pki.kubeconfig(n.Name+"-kubelet", c.server, "system:node:"+n.Name, "system:nodes")
	if err != nil {
		return err
	}
	if err := os.Rename(kubeletKubeconfig, filepath.Join(n.Dir, "kubelet.kubeconfig")); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	proxyKubeconfig, err := c.pki.kubeconfig(n.Name+"-kube-proxy", c.server, "system:kube-proxy")
	if err != nil {
		return err
	}
	proxy := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %[1]q
mode: iptables
hostnameOverride: %[2]s
bindAddress: %[3]s
clusterCIDR: %[4]s
metricsBindAddress: 127.0.0.1:%[5]d
healthzBindAddress: 127.0.0.1:%[6]d
# Zero: leave the conntrack table's size and timeouts, which are host-wide,
# as the host has them.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, proxyKubeconfig, n.Name, n.IP, ClusterCIDR, 10249+10*n.index, 10256+10*n.index)
	if err := os.WriteFile(filepath.Join(n.Dir, "kube-proxy.yaml"), []byte(proxy), 0o644); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	return nil
}

// startContainerd starts the node's containerd and waits for its socket.
func (n *Node) startContainerd(ctx context.Context) error {
	p, err := n.startInNode("containerd", n.c.bin("node/containerd"), "--config", filepath.Join(n.Dir, "containerd.toml"))
	if err != nil {
		return err
	}
	n.ctrd = p
	return wait(ctx, n.Name+" containerd socket", func(ctx context.Context) error {
		if p.exited() {
			return poll.Stop(fmt.Errorf("containerd exited: %v\n%s", p.err, p.tail(30)))
		}
		_, err := os.Stat(n.Socket())
		return err
	})
}

// ImportImage imports an image archive (docker-archive or OCI layout tar)
// into the node's containerd, in the k8s.io namespace the kubelet uses.
func (n *Node) ImportImage(ctx context.Context, archive string) error {
	_, err := run(ctx, n.c.bin("node/ctr"), "--address", n.Socket(), "--namespace", "k8s.io", "images", "import", "--no-unpack=false", archive)
	return err
}

func (n *Node) startKubelet() error {
	p, err := n.startInNode("kubelet", n.c.bin("kubelet"),
		"--config", filepath.Join(n.Dir, "kubelet.yaml"),
		"--kubeconfig", filepath.Join(n.Dir, "kubelet.kubeconfig"),
		"--root-dir", filepath.Join(n.Dir, "kubelet"),
		"--hostname-override", n.Name,
		"--node-ip", n.IP,
		"--v", "2")
	if err != nil {
		return err
	}
	n.kubelet = p
	return nil
}

func (n *Node) startProxy() error {
	p, err := n.startInNode("kube-proxy", n.c.bin("kube-proxy"), "--config", filepath.Join(n.Dir, "kube-proxy.yaml"), "--v", "2")
	if err != nil {
		return err
	}
	n.proxy = p
	return nil
}

// RestartKubelet stops the node's kubelet (SIGTERM) and starts it again; the
// pods keep running meanwhile, as on a real node.
func (n *Node) RestartKubelet(ctx context.Context) error {
	n.kubelet.stop(10 * time.Second)
	return n.startKubelet()
}

// Stop ends the node as a power loss would: every process in its PID
// namespace (kubelet, kube-proxy, containerd, shims, containers) is killed
// at once, and its cgroups removed. The Node object stays, NotReady once the
// node-lifecycle controller notices.
func (n *Node) Stop() {
	if n.holder == nil {
		return
	}
	n.down = true
	n.proxy.stop(0)
	n.kubelet.stop(0)
	n.ctrd.stop(0)
	n.holder.stop(2 * time.Second)
	n.removeCgroup()
}

// shutdown ends the node in order: kubelet and kube-proxy first (so nothing
// restarts containers), then the namespaces.
func (n *Node) shutdown() {
	if n.holder == nil {
		return
	}
	n.kubelet.stop(5 * time.Second)
	n.proxy.stop(5 * time.Second)
	n.ctrd.stop(5 * time.Second)
	n.holder.stop(5 * time.Second)
	n.removeCgroup()
}

// Tail returns the last n lines of each of the node's component logs.
func (n *Node) Tail(lines int) string {
	var b strings.Builder
	for _, p := range []*proc{n.ctrd, n.kubelet, n.proxy} {
		if p != nil {
			fmt.Fprintf(&b, "--- %s (last %d lines of %s)\n%s\n", p.name, lines, p.log, p.tail(lines))
		}
	}
	return b.String()
}
