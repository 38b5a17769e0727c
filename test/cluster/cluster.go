// Package cluster runs a real Kubernetes cluster for kadmit's tests: etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler, and nodes that
// each run a kubelet, kube-proxy (iptables mode) and containerd with runc and
// the bridge CNI plugin. Pods really start, probes really run, Services
// really route through kube-proxy's rules, and the endpoint-slice controller
// really propagates readiness.
//
// Everything runs inside a private network namespace (the test binary is
// re-executed there by Main) and, per node, private mount and PID
// namespaces: nothing is reachable from outside, the host's /var, /run and
// kernel settings are never written, and ending a node's PID namespace ends
// every process the node started. Addresses: nodes 198.18.0.<i>/24 on a
// bridge (198.18.0.0/15 is reserved for benchmarking), pods 10.244.<i>.0/24,
// Services 10.96.0.0/16; the API server listens on 198.18.0.1:6443.
//
// The binaries come from hack/controlplane.sh --node (make cluster): one
// multi-call Kubernetes binary of the pinned version, etcd, containerd 2.x
// from its module, Debian's runc, CNI plugins and iptables.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kadmit/kadmit/test/cluster/image"
	"github.com/kadmit/kadmit/test/controlplane"
	"github.com/kadmit/kadmit/test/poll"
)

// Addresses and ranges of every cluster.
const (
	APIServerIP   = "198.18.0.1"
	APIServerPort = 6443
	ClusterCIDR   = "10.244.0.0/16"
	ServiceCIDR   = "10.96.0.0/16"
	bridgeName    = "kbr0"
)

// PauseRef is the pod sandbox image every node's containerd is pinned to;
// Start builds and imports it.
const PauseRef = image.PauseRef

// EnvKeep names the variable that keeps the work directory (configuration,
// state and every component's log) after Stop, for a failure's post-mortem.
const EnvKeep = "KADMIT_CLUSTER_KEEP"

// ErrUnavailable matches (errors.Is) a Start error caused by what this
// machine lacks (root, a kernel feature, a binary); the message names it.
var ErrUnavailable = errors.New("real cluster unavailable")

// Options configure Start. The zero value starts two nodes.
type Options struct {
	// Dir holds the binaries hack/controlplane.sh --node built; empty means
	// controlplane.DefaultDir().
	Dir string
	// Nodes is the number of nodes (default 2, at most 8).
	Nodes int
	// WorkDir receives configuration, state and logs; empty means a new
	// directory under os.TempDir(), removed by Stop unless KeepWorkDir.
	WorkDir     string
	KeepWorkDir bool
	// Images are image archives imported into every node before Start
	// returns (see package image); the pause image is always imported.
	Images []string
	// Log receives one line per start step; nil discards them.
	Log io.Writer
	// Timeout bounds Start; default 3 minutes.
	Timeout time.Duration
	// ControllerManagerFlags are extra kube-controller-manager flags without
	// the dashes, e.g. {"node-monitor-grace-period": "20s"}.
	ControllerManagerFlags map[string]string
}

// Cluster is a running cluster. Its fields are valid between Start and Stop.
type Cluster struct {
	// Config authenticates as "admin" in system:masters; Client is built
	// from it. Kubeconfig is the same credentials as a file.
	Config     *rest.Config
	Client     kubernetes.Interface
	Kubeconfig string
	// Nodes in order; Nodes[0] is the control-plane node.
	Nodes []*Node
	// WorkDir holds every component's configuration, state and log.
	WorkDir string

	dir     string
	opts    Options
	logDir  string
	pki     *pki
	server  string
	pause   string
	runc    string
	log     io.Writer
	procs   []*proc // control plane, in start order
	api     *proc
	stopped sync.Once
	ownDir  bool
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.dir, name) }

func (c *Cluster) logf(format string, args ...any) {
	if c.log != nil {
		fmt.Fprintf(c.log, "cluster: "+format+"\n", args...)
	}
}

// Start builds nothing: it checks the binaries, then starts the control
// plane and the nodes, imports the images, and returns once every node is
// Ready. It must run inside the private network namespace Main makes
// (ErrUnavailable otherwise). On error everything started is stopped and the
// error carries the last log lines of the component that failed.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if !Inside() {
		return nil, fmt.Errorf("%w: cluster.Start must run inside the private namespaces cluster.Main makes", ErrUnavailable)
	}
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	if opts.Nodes < 1 || opts.Nodes > 8 {
		return nil, fmt.Errorf("cluster: %d nodes: want 1 to 8", opts.Nodes)
	}
	if opts.Timeout == 0 {
		opts.Timeout = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	dir := opts.Dir
	if dir == "" {
		if dir, err = controlplane.DefaultDir(); err != nil {
			return nil, err
		}
	}
	c = &Cluster{dir: dir, opts: opts, log: opts.Log, server: fmt.Sprintf("https://%s:%d", APIServerIP, APIServerPort)}
	if err := c.checkBinaries(); err != nil {
		return nil, err
	}
	c.WorkDir = opts.WorkDir
	if c.WorkDir == "" {
		if c.WorkDir, err = os.MkdirTemp("", "kadmit-cluster-"); err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		c.ownDir = !opts.KeepWorkDir && os.Getenv(EnvKeep) != "1"
	}
	c.logDir = filepath.Join(c.WorkDir, "logs")
	if err := os.MkdirAll(c.logDir, 0o755); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, c.Tail(25))
			c.Stop()
		}
	}()
	began := time.Now()
	// The pause program is both the sandbox image and the namespace
	// holders' init.
	pauseArchive, err := image.Pause(ctx, c.WorkDir)
	if err != nil {
		return c, err
	}
	c.pause = filepath.Join(c.WorkDir, "pause")
	if c.pki, err = newPKI(filepath.Join(c.WorkDir, "pki")); err != nil {
		return c, err
	}
	for i := range opts.Nodes {
		c.Nodes = append(c.Nodes, &Node{
			Name: fmt.Sprintf("node%d", i+1), IP: fmt.Sprintf("198.18.0.%d", i+1),
			PodCIDR: fmt.Sprintf("10.244.%d.0/24", i), Dir: filepath.Join(c.WorkDir, fmt.Sprintf("node%d", i+1)),
			index: i, c: c, cgroup: fmt.Sprintf("/kadmit-test-%d-node%d", os.Getpid(), i+1),
		})
	}
	if err := c.network(ctx); err != nil {
		return c, err
	}
	c.logf("network ready (%s)", time.Since(began).Round(time.Millisecond))
	if err := c.startControlPlane(ctx); err != nil {
		return c, err
	}
	c.logf("API server ready (%s)", time.Since(began).Round(time.Millisecond))
	images := append([]string{pauseArchive}, opts.Images...)
	errs := make(chan error, len(c.Nodes))
	for _, n := range c.Nodes {
		go func() { errs <- c.startNode(ctx, n, images) }()
	}
	for range c.Nodes {
		if e := <-errs; e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		return c, err
	}
	if err := c.WaitNodesReady(ctx); err != nil {
		return c, err
	}
	if err := c.Alive(); err != nil {
		return c, err
	}
	c.logf("%d nodes Ready (%s from start); work directory %s", len(c.Nodes), time.Since(began).Round(time.Millisecond), c.WorkDir)
	return c, nil
}

func (c *Cluster) checkBinaries() error {
	var missing []string
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl", "node/containerd", "node/containerd-shim-runc-v2", "node/ctr"} {
		if _, err := os.Stat(c.bin(b)); err != nil {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s missing in %s (run `make cluster`, i.e. hack/controlplane.sh --node)", controlplane.ErrBinariesMissing, strings.Join(missing, ", "), c.dir)
	}
	var err error
	if c.runc, err = exec.LookPath("runc"); err != nil {
		return fmt.Errorf("%w: runc not found (Debian package runc; make cluster installs it)", controlplane.ErrBinariesMissing)
	}
	for _, b := range []string{"bridge", "host-local", "portmap", "loopback"} {
		if _, err := os.Stat(filepath.Join("/usr/lib/cni", b)); err != nil {
			return fmt.Errorf("%w: CNI plugin /usr/lib/cni/%s missing (Debian package containernetworking-plugins)", controlplane.ErrBinariesMissing, b)
		}
	}
	for _, b := range []string{"iptables", "nsenter", "unshare", "ip", "mount"} {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Errorf("%w: %s not found", controlplane.ErrBinariesMissing, b)
		}
	}
	return nil
}

// network puts the control-plane node's address on a bridge in this
// (private) namespace; every other node gets a network namespace (its
// holder's) joined to the bridge by a veth pair. Routes send each node's pod
// range to that node and the Service range to the bridge, where each node's
// kube-proxy rules catch it.
func (c *Cluster) network(ctx context.Context) error {
	steps := [][]string{
		{"ip", "link", "add", bridgeName, "type", "bridge"},
		{"ip", "addr", "add", APIServerIP + "/24", "dev", bridgeName},
		{"ip", "link", "set", bridgeName, "up"},
		{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"ip", "route", "add", ServiceCIDR, "dev", bridgeName},
	}
	for _, s := range steps {
		if _, err := run(ctx, s...); err != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	for _, n := range c.Nodes {
		if err := os.MkdirAll(n.Dir, 0o755); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
		if err := n.makeCgroup(); err != nil {
			return err
		}
		if err := n.startHolder(ctx); err != nil {
			return err
		}
		if n.index == 0 {
			continue
		}
		host := fmt.Sprintf("kveth%d", n.index+1)
		for _, s := range [][]string{
			{"ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", strconv.Itoa(n.holder.pid)},
			{"ip", "link", "set", host, "master", bridgeName},
			{"ip", "link", "set", host, "up"},
			{"ip", "route", "add", n.PodCIDR, "via", n.IP},
		} {
			if _, err := run(ctx, s...); err != nil {
				return fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
		}
		in := [][]string{
			{"ip", "link", "set", "lo", "up"},
			{"ip", "addr", "add", n.IP + "/24", "dev", "eth0"},
			{"ip", "link", "set", "eth0", "up"},
			{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
			{"ip", "route", "add", ServiceCIDR, "via", APIServerIP},
		}
		for _, o := range c.Nodes {
			if o != n {
				in = append(in, []string{"ip", "route", "add", o.PodCIDR, "via", o.IP})
			}
		}
		for _, s := range in {
			if _, err := n.nsenter(ctx, s...); err != nil {
				return fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
		}
	}
	return nil
}

func (c *Cluster) startControlPlane(ctx context.Context) error {
	p := c.pki
	etcd, err := startProc(c.logDir, "etcd", []string{c.bin("etcd"),
		"--data-dir", filepath.Join(c.WorkDir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "default=http://127.0.0.1:2380",
		"--unsafe-no-fsync"}, nil)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, etcd)

	serving, servingKey, err := p.issue("apiserver", "kube-apiserver", nil,
		[]net.IP{net.ParseIP(APIServerIP), net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	if err != nil {
		return err
	}
	kubeletClient, kubeletClientKey, err := p.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil)
	if err != nil {
		return err
	}
	api, err := startProc(c.logDir, "kube-apiserver", []string{c.bin("kube-apiserver"),
		"--etcd-servers", "http://127.0.0.1:2379",
		"--bind-address", "0.0.0.0", "--secure-port", strconv.Itoa(APIServerPort), "--advertise-address", APIServerIP,
		"--tls-cert-file", serving, "--tls-private-key-file", servingKey,
		"--client-ca-file", p.CAFile,
		"--kubelet-client-certificate", kubeletClient, "--kubelet-client-key", kubeletClientKey,
		"--kubelet-certificate-authority", p.CAFile,
		"--kubelet-preferred-address-types", "InternalIP",
		"--service-account-key-file", p.path("sa.pub"), "--service-account-signing-key-file", p.path("sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range", ServiceCIDR,
		"--authorization-mode", "Node,RBAC",
		"--enable-admission-plugins", "NodeRestriction",
		"--allow-privileged=true",
		"--profiling=false",
	}, nil)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, api)
	c.api = api

	admin, err := p.kubeconfig("admin", c.server, "admin", "system:masters")
	if err != nil {
		return err
	}
	c.Kubeconfig = admin
	if c.Config, err = clientcmd.BuildConfigFromFlags("", admin); err != nil {
		return fmt.Errorf("cluster: admin config: %w", err)
	}
	c.Config.QPS, c.Config.Burst = 100, 200
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return fmt.Errorf("cluster: admin client: %w", err)
	}
	if err := wait(ctx, "kube-apiserver /readyz", func(ctx context.Context) error {
		for _, q := range []*proc{etcd, api} {
			if q.exited() {
				return poll.Stop(fmt.Errorf("%s exited: %v\n%s", q.name, q.err, q.tail(30)))
			}
		}
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("%w: %s", err, body)
		}
		return nil
	}); err != nil {
		return err
	}

	cmConfig, err := p.kubeconfig("controller-manager", c.server, "system:kube-controller-manager")
	if err != nil {
		return err
	}
	cmArgs := []string{c.bin("kube-controller-manager"),
		"--kubeconfig", cmConfig, "--authentication-kubeconfig", cmConfig, "--authorization-kubeconfig", cmConfig,
		"--bind-address", "127.0.0.1", "--secure-port", "10257",
		"--leader-elect=false", "--use-service-account-credentials=true",
		"--service-account-private-key-file", p.path("sa.key"), "--root-ca-file", p.CAFile,
		"--cluster-cidr", ClusterCIDR, "--service-cluster-ip-range", ServiceCIDR,
		"--allocate-node-cidrs=false",
	}
	for k, v := range c.opts.ControllerManagerFlags {
		cmArgs = append(cmArgs, "--"+k+"="+v)
	}
	cm, err := startProc(c.logDir, "kube-controller-manager", cmArgs, nil)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, cm)
	schedConfig, err := p.kubeconfig("scheduler", c.server, "system:kube-scheduler")
	if err != nil {
		return err
	}
	sched, err := startProc(c.logDir, "kube-scheduler", []string{c.bin("kube-scheduler"),
		"--kubeconfig", schedConfig, "--authentication-kubeconfig", schedConfig, "--authorization-kubeconfig", schedConfig,
		"--bind-address", "127.0.0.1", "--secure-port", "10259", "--leader-elect=false"}, nil)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, sched)
	return nil
}

func (c *Cluster) startNode(ctx context.Context, n *Node, images []string) error {
	if err := n.writeFiles(); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	for _, img := range images {
		if err := n.ImportImage(ctx, img); err != nil {
			return fmt.Errorf("cluster: %s: import %s: %w", n.Name, img, err)
		}
	}
	if err := n.startKubelet(); err != nil {
		return err
	}
	if err := n.startProxy(); err != nil {
		return err
	}
	// The node's pod range, as the node IPAM controller would set it
	// (--allocate-node-cidrs is off so each node's range, and the routes
	// network() made for it, are known before the node registers).
	return wait(ctx, n.Name+" registered", func(ctx context.Context) error {
		if n.kubelet.exited() {
			return poll.Stop(fmt.Errorf("kubelet exited: %v\n%s", n.kubelet.err, n.kubelet.tail(30)))
		}
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if node.Spec.PodCIDR == n.PodCIDR {
			return nil
		}
		patch := fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q]}}`, n.PodCIDR, n.PodCIDR)
		_, err = c.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	})
}

// WaitNodesReady waits until every node reports Ready.
func (c *Cluster) WaitNodesReady(ctx context.Context) error {
	return wait(ctx, "nodes Ready", func(ctx context.Context) error {
		for _, n := range c.Nodes {
			if n.kubelet == nil || n.kubelet.exited() {
				continue
			}
			node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			ready := false
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready = true
				}
			}
			if !ready {
				return fmt.Errorf("%s not Ready", n.Name)
			}
		}
		return nil
	})
}

// Alive returns an error naming the first control-plane or node component
// that has exited (a crashed controller-manager otherwise shows only as
// Deployments that never become Ready).
func (c *Cluster) Alive() error {
	for _, p := range c.procs {
		if p.exited() {
			return fmt.Errorf("cluster: %s exited: %v\n%s", p.name, p.err, p.tail(30))
		}
	}
	for _, n := range c.Nodes {
		for _, p := range []*proc{n.ctrd, n.kubelet, n.proxy} {
			if p != nil && p.exited() && !n.down {
				return fmt.Errorf("cluster: %s exited: %v\n%s", p.name, p.err, p.tail(30))
			}
		}
	}
	return nil
}

// ImportImage imports an image archive into every node's containerd.
func (c *Cluster) ImportImage(ctx context.Context, archive string) error {
	for _, n := range c.Nodes {
		if err := n.ImportImage(ctx, archive); err != nil {
			return fmt.Errorf("cluster: %s: %w", n.Name, err)
		}
	}
	return nil
}

// Kubectl runs the cluster's kubectl as admin and returns its combined
// output; it ends at ctx's deadline, or after a minute when ctx has none.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return run(ctx, append([]string{c.bin("kubectl"), "--kubeconfig", c.Kubeconfig}, args...)...)
}

// RestartAPIServer stops kube-apiserver and starts it again with the same
// flags: its connections to webhooks are all new afterwards (the API server
// reuses keep-alive connections, which hides a Service selector that matches
// a second workload until a new connection is opened).
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	args := c.api.cmd.Args
	// A short grace: the restart only has to drop every connection, and
	// a graceful API server shutdown waits ~15 s for its watches.
	c.api.stop(3 * time.Second)
	api, err := startProc(c.logDir, "kube-apiserver", args, nil)
	if err != nil {
		return err
	}
	for i, q := range c.procs {
		if q == c.api {
			c.procs[i] = api
		}
	}
	c.api = api
	return wait(ctx, "kube-apiserver /readyz after restart", func(ctx context.Context) error {
		if api.exited() {
			return poll.Stop(fmt.Errorf("kube-apiserver exited: %v\n%s", api.err, api.tail(30)))
		}
		_, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	})
}

// APIServerLog is the path of kube-apiserver's log.
func (c *Cluster) APIServerLog() string { return c.api.log }

// Tail returns the last lines of every component's log, for a test failure.
func (c *Cluster) Tail(lines int) string {
	var b strings.Builder
	for _, p := range c.procs {
		fmt.Fprintf(&b, "--- %s (last %d lines of %s)\n%s\n", p.name, lines, p.log, p.tail(lines))
	}
	for _, n := range c.Nodes {
		b.WriteString(n.Tail(lines))
	}
	return b.String()
}

// Stop ends every node (kubelet and kube-proxy first, then the node's PID
// namespace with containerd, its shims and the containers), then the
// control plane in reverse start order, removes the cgroups and, when
// Start made it, the work directory. It is safe to call more than once.
func (c *Cluster) Stop() {
	c.stopped.Do(func() {
		var wg sync.WaitGroup
		for _, n := range c.Nodes {
			wg.Add(1)
			go func() { defer wg.Done(); n.shutdown() }()
		}
		wg.Wait()
		for i := len(c.procs) - 1; i >= 0; i-- {
			c.procs[i].stop(10 * time.Second)
		}
		for _, n := range c.Nodes {
			if n.index > 0 {
				_, _ = run(context.Background(), "ip", "link", "del", fmt.Sprintf("kveth%d", n.index+1))
			}
		}
		_, _ = run(context.Background(), "ip", "link", "del", bridgeName)
		if c.ownDir {
			// Bind mounts lived in the nodes' mount namespaces, which died
			// with their holders, so the tree is plain files now.
			_ = os.RemoveAll(c.WorkDir)
		}
	})
}
