package diagcluster

// The harness: the webhook server's image, the cluster, kadmit's chart with
// the watch, the watch observed through test/watchprobe, and what every
// fixture shares (a CA, the restricted pod security, rollout waits).

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/cluster/image"
	"github.com/kadmit/kadmit/test/deploy/chart"
	"github.com/kadmit/kadmit/test/deploy/realcluster"
	"github.com/kadmit/kadmit/test/poll"
	"github.com/kadmit/kadmit/test/watchprobe"
)

// WebhookRef is the image of ./webhook, imported into every node.
const WebhookRef = "kadmit.test/diag-webhook:1"

// The watch's settings through the chart's values. handshakeInterval 5s
// (chart default 20s) so that the handshake-driven classes fit the test, as
// in the routed simulation; a short lease so that a drain that evicts the
// leader hands over within seconds (the watch releases its Lease on
// SIGTERM).
const (
	watchHandshakeInterval = 5 * time.Second
	watchLeaseDuration     = 6 * time.Second
	watchMetricsPort       = "8080"
	// watchReplicas: the chart's default, a leader and a standby.
	watchReplicas = 2
)

// watchValues are the chart values of the install (merged over
// realcluster.Values): the watch on, with the cert-manager reads the
// cert-manager-like injector's configuration needs (KD411).
func watchValues() map[string]any {
	return map[string]any{
		"watch": map[string]any{
			"enabled":           true,
			"replicas":          watchReplicas,
			"handshakeInterval": watchHandshakeInterval.String(),
			"leaderElection":    map[string]any{"leaseDuration": watchLeaseDuration.String(), "renewDeadline": "4s", "retryPeriod": "1s"},
			"certManager":       map[string]any{"readCertificates": true, "secretNamespaces": []any{lwsNS}},
		},
	}
}

// built holds what the package builds once: ./webhook's image.
var built struct {
	once    sync.Once
	dir     string
	archive string
	err     error
}

// webhookImage builds ./webhook (static, as kadmit's Dockerfile builds) into
// an image archive of WebhookRef, once per test binary; it runs as
// distroless's nonroot.
func webhookImage(ctx context.Context) (string, error) {
	built.once.Do(func() {
		root, err := chart.RepoRoot()
		if err != nil {
			built.err = err
			return
		}
		if built.dir, err = os.MkdirTemp("", "kadmit-diagcluster-"); err != nil {
			built.err = err
			return
		}
		bin := filepath.Join(built.dir, "webhook")
		if err := image.BuildGo(ctx, filepath.Join(root, "test", "deploy"), "./diagcluster/webhook", bin); err != nil {
			built.err = err
			return
		}
		archive := filepath.Join(built.dir, "webhook.tar")
		files := append(image.BaseFiles(), image.File{Path: "/webhook", Mode: 0o755, Source: bin})
		if err := image.Write(archive, WebhookRef, files, image.Config{Entrypoint: []string{"/webhook"}, User: image.NonRoot}); err != nil {
			built.err = err
			return
		}
		built.archive = archive
	})
	return built.archive, built.err
}

// startCluster starts the two-node cluster with kadmit's image and the
// webhook server's imported.
func startCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	opts := realcluster.Options{Cluster: cluster.Options{Nodes: 2}}
	if cluster.Inside() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		began := time.Now()
		archive, err := webhookImage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("webhook server image %s built in %s", WebhookRef, time.Since(began).Round(time.Millisecond))
		opts.Cluster.Images = []string{archive}
	}
	return realcluster.Start(t, opts)
}

// ctxFor is a context bounded by d, cancelled when t ends.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// ensureNamespace creates namespace name with labels and waits for its
// default ServiceAccount (the ServiceAccount admission plugin refuses pods
// until then).
func ensureNamespace(ctx context.Context, c *cluster.Cluster, name string, labels map[string]string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", name, err)
	}
	return poll.Until(ctx, 30*time.Second, func(ctx context.Context) error {
		_, err := c.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

// ignored labels a namespace out of kadmit's own webhooks (the chart's
// exclusion label), as an operator does for the namespaces of other
// controllers' webhooks, so kadmit's Fail webhooks do not intercept the pods
// those need to come back (KD505).
var ignored = map[string]string{"kadmit.io/ignore": "true"}

// ---------------------------------------------------------------------------
// Certificates.

// healthyValidity is the fixtures' serving certificates' and CAs' lifetime:
// well past the 7 days of the expiry alerts.
const healthyValidity = 365 * 24 * time.Hour

// testCA signs serving certificates.
type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	c, k, err := webhookcerts.NewCA(time.Now(), healthyValidity, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: c, key: k, pem: webhookcerts.EncodeCertificates(c)}
}

// secret is a kubernetes.io/tls Secret with a serving certificate for
// dnsName valid from notBefore for validity, and ca.crt.
func (ca *testCA) secret(t *testing.T, ns, name, dnsName string, notBefore time.Time, validity time.Duration) *corev1.Secret {
	t.Helper()
	crt, key, err := webhookcerts.IssueServing(ca.cert, ca.key, []string{dnsName}, nil, notBefore, validity, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key, "ca.crt": ca.pem},
	}
}

// ---------------------------------------------------------------------------
// Webhook workloads.

// webhookPortName is the container port the webhook Services target by
// name (kubebuilder's).
const webhookPortName = "webhook-server"

// preStopSleep and grace make a webhook workload that keeps serving while
// its endpoint leaves the Service (no KD203): the chart's own values.
const (
	preStopSleep = 10
	podGrace     = preStopSleep + 10
)

// webhookDeployment is a Deployment of the webhook server: replicas pods
// labelled labels, serving the certificate of Secret secret on port
// webhook-server (9443), ready by /readyz on port health, with a preStop
// sleep; rollouts never drop below replicas ready (maxUnavailable 0).
// nodeSelector pins it when set. The pods meet Pod Security "restricted".
func webhookDeployment(ns, name string, labels map[string]string, replicas int32, secret string, nodeSelector map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
				MaxUnavailable: ptr.To(intstr.FromInt32(0)), MaxSurge: ptr.To(intstr.FromInt32(1))}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  nodeSelector,
					TerminationGracePeriodSeconds: ptr.To[int64](podGrace),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					// Spread over the nodes (best effort), as the controllers'
					// charts do.
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "kubernetes.io/hostname",
						WhenUnsatisfiable: corev1.ScheduleAnyway, LabelSelector: &metav1.LabelSelector{MatchLabels: labels}}},
					Containers: []corev1.Container{{
						Name: "webhook", Image: WebhookRef, ImagePullPolicy: corev1.PullNever,
						Args: []string{"--cert-dir=/certs", "--port=9443", "--health-port=8081"},
						Ports: []corev1.ContainerPort{
							{Name: webhookPortName, ContainerPort: 9443, Protocol: corev1.ProtocolTCP},
							{Name: "health", ContainerPort: 8081, Protocol: corev1.ProtocolTCP},
						},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("health")}},
							PeriodSeconds: 1, TimeoutSeconds: 2, FailureThreshold: 3,
						},
						Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: preStopSleep}}},
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "cert", MountPath: "/certs", ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{{Name: "cert", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret}}}},
				},
			},
		},
	}
}

// webhookService routes port 443 to the pods' webhook-server port.
func webhookService(ns, name string, selector map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: selector,
			Ports: []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString(webhookPortName)}}},
	}
}

// rolledOut returns nil once Deployment ns/name has every replica updated,
// ready and available and no old one left.
func rolledOut(ctx context.Context, c *cluster.Cluster, ns, name string) error {
	d, err := c.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	want := ptr.Deref(d.Spec.Replicas, 1)
	s := d.Status
	if s.ObservedGeneration < d.Generation || s.UpdatedReplicas != want || s.ReadyReplicas != want || s.AvailableReplicas != want || s.Replicas != want {
		return fmt.Errorf("deployment %s/%s: want %d updated, ready and available: generation %d observed %d, %d replicas, %d updated, %d ready, %d available",
			ns, name, want, d.Generation, s.ObservedGeneration, s.Replicas, s.UpdatedReplicas, s.ReadyReplicas, s.AvailableReplicas)
	}
	return nil
}

// waitRolledOut waits (at most timeout) for rolledOut.
func waitRolledOut(ctx context.Context, c *cluster.Cluster, ns, name string, timeout time.Duration) error {
	return poll.Until(ctx, timeout, func(ctx context.Context) error {
		if err := c.Alive(); err != nil {
			return poll.Stop(err)
		}
		return rolledOut(ctx, c, ns, name)
	})
}

// podsDump is `kubectl get pods,endpointslices -A -o wide` for a failure
// message.
func podsDump(c *cluster.Cluster) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, _ := c.Kubectl(ctx, "get", "pods,endpointslices", "-A", "-o", "wide")
	return out
}

// ---------------------------------------------------------------------------
// The watch, observed.

// chartRules renders the chart with values and the PrometheusRule on and
// returns the rules of the watch's group: the alert expressions an
// operator's Prometheus would evaluate for this install.
func chartRules(values map[string]any) ([]watchprobe.Rule, error) {
	v := realcluster.Values(realcluster.Tag, values)
	v["metrics"] = map[string]any{"prometheusRule": map[string]any{"enabled": true}}
	r, err := chart.Render(realcluster.ReleaseName, realcluster.HelmNamespace, v)
	if err != nil {
		return nil, err
	}
	var docs []string
	for _, o := range r.Objects {
		if o.GetKind() == "PrometheusRule" {
			b, err := yaml.Marshal(o.Object)
			if err != nil {
				return nil, err
			}
			docs = append(docs, string(b))
		}
	}
	rules, err := watchprobe.ParseRules([]byte(strings.Join(docs, "\n---\n")), watchprobe.AlertGroup)
	if err != nil {
		return nil, err
	}
	if len(rules) == 0 {
		return nil, fmt.Errorf("the chart renders no rule of group %s (PrometheusRules: %d)", watchprobe.AlertGroup, len(docs))
	}
	return rules, nil
}

// watchTargets discovers the watch's pods as Prometheus's endpoint
// discovery of the chart's ServiceMonitor would: each running,
// non-terminating pod of the watch with an IP is a target, labelled as the
// ServiceMonitor labels it (job and service: the metrics Service, namespace,
// pod, container, endpoint, instance).
func watchTargets(c *cluster.Cluster, rel *realcluster.Release) func(context.Context) ([]watchprobe.Target, error) {
	svc := rel.FullName + "-watch-metrics"
	sel := "app.kubernetes.io/name=kadmit-watch,app.kubernetes.io/instance=" + rel.Name
	return func(ctx context.Context) ([]watchprobe.Target, error) {
		pods, err := c.Client.CoreV1().Pods(rel.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return nil, err
		}
		var out []watchprobe.Target
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				continue
			}
			inst := net.JoinHostPort(p.Status.PodIP, watchMetricsPort)
			out = append(out, watchprobe.Target{URL: "http://" + inst + "/metrics", Labels: map[string]string{
				"job": svc, "service": svc, "namespace": rel.Namespace, "pod": p.Name, "container": "watch", "endpoint": "metrics", "instance": inst}})
		}
		slices.SortFunc(out, func(a, b watchprobe.Target) int { return strings.Compare(a.URL, b.URL) })
		return out, nil
	}
}

// leaders counts the targets of a scrape that report kadmit_watch_leader 1.
func leaders(sc *watchprobe.Scrape) int {
	n := 0
	for _, x := range sc.Find("kadmit_watch_leader", nil) {
		if x.Value == 1 {
			n++
		}
	}
	return n
}

// healthy returns nil when the last scrape shows configuration cfg's
// webhooks (at least min of them) tracked by the leader with want ready
// endpoints each (0: any number above one), every one handshaken, no
// warning or error finding and no alert expression true for it.
func healthy(t *testing.T, p *watchprobe.Probe, cfg string, min, want int) error {
	sc := p.Scraper.Latest()
	if sc == nil {
		return errors.New("no scrape yet")
	}
	if leaders(sc) != 1 {
		return fmt.Errorf("%d watch targets lead", leaders(sc))
	}
	infos := sc.Find("kadmit_watch_webhook_info", map[string]string{"configuration": cfg})
	if len(infos) < min {
		return fmt.Errorf("%s: %d webhooks tracked, want %d", cfg, len(infos), min)
	}
	for _, info := range infos {
		wh := map[string]string{"configuration": cfg, "webhook": info.Labels["webhook"]}
		v, ok := sc.Value("kadmit_watch_ready_endpoints", wh)
		if !ok || (want > 0 && int(v) != want) || v < 2 {
			return fmt.Errorf("%s: %s ready endpoints %v (present %v), want %d", cfg, wh["webhook"], v, ok, want)
		}
		if n := len(sc.Find("kadmit_watch_serving_cert_expiry_timestamp_seconds", wh)); n != int(v) {
			return fmt.Errorf("%s: %s: %d of %v endpoints handshaken", cfg, wh["webhook"], n, v)
		}
	}
	if fs := watchprobe.Findings(sc, cfg, "warning", "error"); len(fs) > 0 {
		return fmt.Errorf("%s not healthy: %v", cfg, fs)
	}
	for _, r := range p.Alerts.Rules {
		if p.Alerts.Firing(t, r.Name, sc.At, cfg) {
			return fmt.Errorf("%s not healthy: alert %s true", cfg, r.Name)
		}
	}
	return nil
}
