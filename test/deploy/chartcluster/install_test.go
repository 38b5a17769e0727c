package chartcluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/deploy/realcluster"

	"github.com/kadmit/kadmit/test/poll"
)

// loadNamespace is where the tests create pods: unlabelled, so kadmit's
// webhooks match it.
const loadNamespace = "workloads"

// TestInstall installs the chart with the watch enabled, then with
// tls.mode=files from a cert-manager-style Secret (TestDisruptionsUnderLoad
// covers the default values): each time its pods become Ready by their
// real probes on both nodes, both webhook configurations are registered, a
// real pod created through the API server is mutated by kadmit (lifespan)
// and one is refused (pod-name), no admission fails while it starts, and
// helm uninstall leaves nothing of the release behind.
func TestInstall(t *testing.T) {
	c := env(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := realcluster.EnsureNamespace(ctx, c, loadNamespace); err != nil {
		t.Fatal(err)
	}
	t.Run("watch", func(t *testing.T) {
		// The default spread is ScheduleAnyway (best effort: twice, under a
		// compile and once on a quiet machine, the scheduler put all three
		// replicas on node1 as the watch's pods started beside them); this
		// install takes the chart's documented switch that requires
		// distinct nodes, so its spread assertion checks the constraint
		// itself. tls-files keeps the default.
		rel := installChecked(t, ctx, c, realcluster.InstallOptions{Values: map[string]any{"watch": map[string]any{"enabled": true},
			"topologySpread": map[string]any{"whenUnsatisfiable": "DoNotSchedule"}}})
		uninstallChecked(t, ctx, rel)
	})
	t.Run("tls-files", func(t *testing.T) {
		// docs/install.md's cert-manager recipe: a namespace made
		// beforehand (the pods mount the Secret, so it must exist before
		// them) holding a Secret with tls.crt, tls.key and ca.crt.
		const ns, secret = "webhooks", "kadmit-serving"
		if err := realcluster.EnsureNamespace(ctx, c, ns); err != nil {
			t.Fatal(err)
		}
		s, err := servingSecret(ns, secret, "kadmit")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Client.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rel := installChecked(t, ctx, c, realcluster.InstallOptions{Values: map[string]any{
			"namespace": map[string]any{"create": false, "name": ns},
			"tls":       map[string]any{"mode": "files", "secretName": secret},
		}})
		uninstallChecked(t, ctx, rel, "Secret "+ns+"/"+secret)
	})
}

// installChecked installs with opts under a load that measures the time to
// the first admitted (mutated) pod, and checks the release: no failed
// admission while it started, pods Ready on every node, a real pod mutated
// and an offensive one refused. If the test fails before
// uninstallChecked, the release is uninstalled at cleanup.
func installChecked(t *testing.T, ctx context.Context, c *cluster.Cluster, opts realcluster.InstallOptions) *realcluster.Release {
	t.Helper()
	// The load runs from before the install until the first mutated pod
	// (or its bound): what it counts while kadmit starts is what a user
	// creating pods during the install would see.
	load, err := realcluster.StartLoad(ctx, c, realcluster.LoadOptions{Namespace: loadNamespace, Rate: loadRate, Duration: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// Release name and namespace as the chart makes them (the tests use
	// the default release name).
	ns := realcluster.Namespace
	if v, ok := opts.Values["namespace"].(map[string]any); ok {
		if n, ok := v["name"].(string); ok {
			ns = n
		}
	}
	tl := realcluster.StartTimeline(ctx, c, ns, "app.kubernetes.io/instance="+realcluster.ReleaseName, realcluster.ReleaseName)
	tl.WatchWebhookConfigurations(ctx, c, realcluster.ReleaseName)
	defer tl.Stop()
	began := time.Now()
	tl.Add("helm install")
	rel, err := realcluster.Install(ctx, c, opts)
	installed := time.Since(began)
	if rel != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Log(diagnose(context.Background(), c, rel))
			}
			if !rel.Uninstalled() {
				if err := rel.Uninstall(context.Background(), 0); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			}
		})
	}
	if err != nil {
		load.Stop()
		t.Fatalf("%v\n%s", err, diagnose(ctx, c, rel))
	}
	tl.Add("release Ready")
	for load.Result().FirstMutated == 0 {
		select {
		case <-load.Done():
		case <-time.After(20 * time.Millisecond):
			continue
		}
		break
	}
	res := load.Stop()
	if res.FirstMutated == 0 {
		t.Fatalf("no admitted pod was mutated by kadmit within the load's bound: %v", res)
	}
	first := res.Start.Add(res.FirstMutated).Sub(began)
	t.Logf("helm install to Ready (rolled out, webhooks registered): %s; to the first admitted (mutated) pod: %s; during the start: %d creations, %d failed, %d admitted before kadmit was registered, %d unmutated after",
		installed.Round(time.Millisecond), first.Round(time.Millisecond), res.Total, res.Failed, res.BypassedBeforeFirstMutated, res.Bypassed-res.BypassedBeforeFirstMutated)
	if res.Failed > 0 {
		t.Errorf("admissions failed while kadmit started: %v\n%s", res, explain(c, tl, res, began))
	}
	if n := res.Bypassed - res.BypassedBeforeFirstMutated; n > 0 {
		t.Errorf("%d pods admitted without kadmit's mutation after the first mutated one: %v", n, res)
	}

	pods, err := rel.Pods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]int{}
	for _, p := range pods {
		if !podReady(&p) {
			t.Errorf("pod %s not Ready after the rollout", p.Name)
		}
		nodes[p.Spec.NodeName]++
	}
	if len(nodes) != len(c.Nodes) {
		t.Errorf("kadmit's pods per node %v: want them spread over all %d nodes", nodes, len(c.Nodes))
	}
	t.Logf("%d pods Ready, per node %v", len(pods), nodes)

	// A real pod through the API server: stored, mutated by lifespan.
	p := realcluster.LoadPod(loadNamespace)
	p.OwnerReferences = nil
	p.GenerateName = "install-check-"
	created, err := c.Client.CoreV1().Pods(loadNamespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create a pod: %v", err)
	}
	_ = c.Client.CoreV1().Pods(loadNamespace).Delete(ctx, created.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if !realcluster.Mutated(created) {
		t.Errorf("pod %s created without kadmit's lifespan tolerations: %v", created.Name, created.Spec.Tolerations)
	}
	// ... and one pod-name refuses.
	bad := realcluster.LoadPod(loadNamespace)
	bad.GenerateName, bad.OwnerReferences = "offensive-", nil
	if _, err := c.Client.CoreV1().Pods(loadNamespace).Create(ctx, bad, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil || !strings.Contains(err.Error(), "pod-name.kadmit.io") {
		t.Errorf("a pod named offensive-*: got %v, want a denial by pod-name.kadmit.io", err)
	}
	return rel
}

// uninstallChecked runs helm uninstall and checks that no webhook
// configuration, Secret or RBAC object of the release is left (keep: the
// objects the test made itself).
func uninstallChecked(t *testing.T, ctx context.Context, rel *realcluster.Release, keep ...string) {
	t.Helper()
	began := time.Now()
	if err := rel.Uninstall(ctx, 0); err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	err := poll.Until(ctx, time.Minute, func(context.Context) error {
		left, err := rel.Leftovers(ctx, keep...)
		if err != nil {
			return err
		}
		if len(left) > 0 {
			return fmt.Errorf("left behind: %s", strings.Join(left, ", "))
		}
		return nil
	})
	if err != nil {
		t.Errorf("helm uninstall: %v", err)
	}
	t.Logf("helm uninstall (pre-delete hook included) %s, nothing left %s later", took.Round(time.Millisecond), (time.Since(began) - took).Round(time.Millisecond))
}

// explain lines each of the load's first failures up with the pod and
// endpoint timeline around it and the API server's log of webhook
// failures.
func explain(c *cluster.Cluster, tl *realcluster.Timeline, res realcluster.LoadResult, since time.Time) string {
	var b strings.Builder
	shown := 0
	var lastAt time.Time
	for _, f := range res.Failures {
		at := res.Start.Add(f.At)
		if !lastAt.IsZero() && at.Sub(lastAt) < 5*time.Second {
			continue
		}
		lastAt = at
		if shown++; shown > 3 {
			break
		}
		fmt.Fprintf(&b, "--- failure answered at %s: %s\n", at.UTC().Format("15:04:05.000"), f.Err)
		for _, e := range tl.Around(at, 8*time.Second) {
			fmt.Fprintf(&b, "    %s\n", e)
		}
	}
	// When node1's kube-proxy (the API server's) rewrote its rules around
	// the first failure: a Service's rules lag its EndpointSlice by up to
	// its sync period.
	if len(res.Failures) > 0 {
		at := res.Start.Add(res.Failures[0].At)
		lines, err := realcluster.LogLines(filepath.Join(c.WorkDir, "logs", c.Nodes[0].Name+"-kube-proxy.log"), "SyncProxyRules complete", at.Add(-3*time.Second), at.Add(3*time.Second), 12)
		if err != nil {
			fmt.Fprintf(&b, "--- kube-proxy log: %v\n", err)
		} else {
			fmt.Fprintf(&b, "--- %s's kube-proxy, rule syncs within 3 s of the first failure:\n%s\n", c.Nodes[0].Name, strings.Join(lines, "\n"))
		}
	}
	lines, err := realcluster.LogLines(c.APIServerLog(), "ailed calling webhook", since.Add(-time.Second), time.Now(), 12)
	if err != nil {
		fmt.Fprintf(&b, "--- kube-apiserver log: %v\n", err)
	} else {
		fmt.Fprintf(&b, "--- kube-apiserver log, webhook call failures (first %d):\n%s\n", len(lines), strings.Join(lines, "\n"))
	}
	return b.String()
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// diagnose gathers what explains a failed install: pods, events, and the
// logs of kadmit's pods.
func diagnose(ctx context.Context, c *cluster.Cluster, rel *realcluster.Release) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var b strings.Builder
	out, _ := c.Kubectl(ctx, "get", "pods,deploy,endpointslices", "-A", "-o", "wide")
	fmt.Fprintf(&b, "--- kubectl get pods,deploy,endpointslices -A\n%s\n", out)
	out, _ = c.Kubectl(ctx, "get", "events", "-A", "--sort-by=.lastTimestamp")
	fmt.Fprintf(&b, "--- events\n%s\n", tailLines(out, 40))
	if rel != nil {
		out, _ = c.Kubectl(ctx, "logs", "-n", rel.Namespace, "-l", rel.Selector(), "--tail=30", "--prefix", "--all-containers")
		fmt.Fprintf(&b, "--- kadmit logs\n%s\n", out)
	}
	return b.String()
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// servingSecret is what cert-manager's CA Issuer writes: a kubernetes.io/tls
// Secret with tls.crt and tls.key for the Service's DNS names and ca.crt,
// the issuing CA.
func servingSecret(ns, name, service string) (*corev1.Secret, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "chartcluster-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: service + "." + ns + ".svc"},
		DNSNames:  []string{service + "." + ns + ".svc", service + "." + ns + ".svc.cluster.local"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Type:       corev1.SecretTypeTLS,
		Data: map[string][]byte{
			"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
			"tls.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
			"ca.crt":  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		},
	}, nil
}
