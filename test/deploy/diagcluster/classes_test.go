package diagcluster

// The failure classes: the eight the routed simulation injects
// (test/e2e/routed TestWatch) and the six of issue 23, each injected into
// its own healthy backend on the real cluster. Faults that live in the pods
// (a port that refuses, a certificate for another name, an expired one, a
// port that never answers, no preStop) come in by a Deployment rollout, as
// a bad release brings them; detection counts from the moment the first
// faulty pod is a ready endpoint of the Service.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	admissionregistrationv1ac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
	"k8s.io/utils/ptr"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/poll"
	"github.com/kadmit/kadmit/test/watchprobe"
)

// diagClass is one failure class on the real cluster.
type diagClass struct {
	watchprobe.Class
	// prepare, when set, adds what the fault needs to the healthy backend
	// at setup (a Secret to roll out to, another namespace).
	prepare func(ctx context.Context, t *testing.T, b *backend) error
	// fault injects into and repairs backend b.
	fault func(t *testing.T, b *backend) watchprobe.Fault
	// onNode2: the backend's pods run on node2 (else node1), and the
	// backend is made when the detection starts, after NoFalseAlarms's
	// drains of node2.
	onNode2 bool
}

// Namespaces of the classes that reach beyond their backend.
const (
	// budgetTargetNS: the namespace the timeout-budget webhooks intercept
	// pods in (empty: nothing calls them).
	budgetTargetNS = "diag-budget-target"
	// cniNS holds a DaemonSet laid out as a CNI plugin's.
	cniNS = "diag-cni"
)

// newSeverities: the six new checks' findings are warnings or errors
// (internal/doctor decides); the eight existing classes are errors.
var newSeverities = []string{"warning", "error"}

func (e *env) faultClasses() []diagClass {
	single := func(b *backend) []watchprobe.Subject {
		return []watchprobe.Subject{{Configuration: b.name, Webhook: b.webhook}}
	}
	configChange := func(edit, undo func(w *admissionregistrationv1.ValidatingWebhook)) func(t *testing.T, b *backend) watchprobe.Fault {
		return func(_ *testing.T, b *backend) watchprobe.Fault {
			return watchprobe.Fault{Subjects: single(b),
				Inject: func(ctx context.Context) (time.Time, error) { return time.Time{}, b.updateConfig(ctx, edit) },
				Repair: func(ctx context.Context) error { return b.updateConfig(ctx, undo) }}
		}
	}
	rollout := func(edit, undo func(*corev1.PodSpec)) func(t *testing.T, b *backend) watchprobe.Fault {
		return func(_ *testing.T, b *backend) watchprobe.Fault {
			return watchprobe.Fault{Subjects: single(b),
				Inject: func(ctx context.Context) (time.Time, error) { return b.rollout(ctx, edit) },
				Repair: func(ctx context.Context) error { _, err := b.rollout(ctx, undo); return err }}
		}
	}
	restoreRules := func(w *admissionregistrationv1.ValidatingWebhook) {
		w.Rules = []admissionregistrationv1.RuleWithOperations{configMapCreate}
		w.NamespaceSelector = inNamespace(w.ClientConfig.Service.Namespace)
		w.TimeoutSeconds = ptr.To[int32](5)
	}
	return []diagClass{
		{Class: watchprobe.Class{Name: "no endpoints", Key: "noendpoints", Check: "KD201", Alert: "KadmitFailWebhookNoEndpoints", Informer: true},
			fault: func(_ *testing.T, b *backend) watchprobe.Fault {
				return watchprobe.Fault{Subjects: single(b),
					Inject: func(ctx context.Context) (time.Time, error) {
						if err := b.scale(ctx, 0); err != nil {
							return time.Time{}, err
						}
						return b.waitNoReadyEndpoint(ctx)
					},
					Repair: func(ctx context.Context) error { return b.scale(ctx, backendReplicas) }}
			}},
		// The pods listen on 9444 while their webhook-server port (what
		// the Service targets) says 9443: ready by the health port,
		// refusing on the webhook port.
		{Class: watchprobe.Class{Name: "endpoint refuses", Key: "refused", Check: "KD202", Alert: "KadmitWebhookTLSBroken", HSReason: "refused"},
			fault: rollout(webhookArgs(func(a []string) []string { return setArg(a, "--port=9444", "--port=") }),
				webhookArgs(func(a []string) []string { return setArg(a, "--port=9443", "--port=") }))},
		// Another workload (a log agent) whose pods carry the Service's
		// selector and a webhook-server port: real pods, routed to.
		{Class: watchprobe.Class{Name: "selector collision", Key: "collision", Check: "KD301", Alert: "KadmitWebhookSelectorCollision", Informer: true},
			fault: func(_ *testing.T, b *backend) watchprobe.Fault {
				name := b.name + "-log-agent"
				lbls := map[string]string{"app": b.name, "component": "log-agent"}
				return watchprobe.Fault{Subjects: single(b),
					Inject: func(ctx context.Context) (time.Time, error) {
						d := webhookDeployment(b.ns, name, lbls, 1, b.secretName(""), b.node)
						_, err := b.c.Client.AppsV1().Deployments(b.ns).Create(ctx, d, metav1.CreateOptions{FieldManager: backendFieldManager})
						return time.Time{}, err
					},
					Repair: func(ctx context.Context) error {
						if err := b.c.Client.AppsV1().Deployments(b.ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
							return err
						}
						// Its pods would sleep out their preStop: gone at once
						// instead, as a removed workload's pods are gone for
						// the Service once they terminate.
						return poll.Until(ctx, 30*time.Second, func(ctx context.Context) error {
							pods, err := b.c.Client.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: "component=log-agent"})
							if err != nil {
								return err
							}
							for _, p := range pods.Items {
								_ = b.c.Client.CoreV1().Pods(b.ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
							}
							rs, err := b.c.Client.AppsV1().ReplicaSets(b.ns).List(ctx, metav1.ListOptions{LabelSelector: "component=log-agent"})
							if err != nil {
								return err
							}
							if len(pods.Items)+len(rs.Items) > 0 {
								return fmt.Errorf("%d pods, %d ReplicaSets of %s left", len(pods.Items), len(rs.Items), name)
							}
							return nil
						})
					}}
			}},
		{Class: watchprobe.Class{Name: "caBundle from another CA", Key: "foreignca", Check: "KD404", Alert: "KadmitWebhookTLSBroken", Informer: true},
			fault: func(t *testing.T, b *backend) watchprobe.Fault {
				other := newTestCA(t)
				return configChange(func(w *admissionregistrationv1.ValidatingWebhook) { w.ClientConfig.CABundle = other.pem },
					func(w *admissionregistrationv1.ValidatingWebhook) { w.ClientConfig.CABundle = b.ca.pem })(t, b)
			}},
		{Class: watchprobe.Class{Name: "certificate for another Service", Key: "othername", Check: "KD405", Alert: "KadmitWebhookTLSBroken", HSReason: "san_mismatch"},
			prepare: func(ctx context.Context, t *testing.T, b *backend) error {
				return b.addSecret(ctx, b.ca.secret(t, b.ns, b.secretName("othername"), "other."+b.ns+".svc", time.Now(), healthyValidity))
			},
			fault: func(t *testing.T, b *backend) watchprobe.Fault {
				return rollout(mountSecret(b.secretName("othername")), mountSecret(b.secretName("")))(t, b)
			}},
		// The expiry alert may be true before the KD406 finding: the watch
		// sets the expiry series from the first handshake, the finding
		// waits for the confirming one.
		{Class: watchprobe.Class{Name: "expired certificate", Key: "expired", Check: "KD406", Alert: "KadmitWebhookCertificateExpiringSoon", HSReason: "expired"},
			prepare: func(ctx context.Context, t *testing.T, b *backend) error {
				return b.addSecret(ctx, b.ca.secret(t, b.ns, b.secretName("expired"), b.host(), time.Now().Add(-48*time.Hour), 24*time.Hour))
			},
			fault: func(t *testing.T, b *backend) watchprobe.Fault {
				return rollout(mountSecret(b.secretName("expired")), mountSecret(b.secretName("")))(t, b)
			}},
		{Class: watchprobe.Class{Name: "self-interception", Key: "selfintercept", Check: "KD501", Alert: "KadmitWebhookSelfInterception", Informer: true},
			fault: configChange(func(w *admissionregistrationv1.ValidatingWebhook) {
				w.Rules = []admissionregistrationv1.RuleWithOperations{podCreate}
			}, restoreRules)},
		// The pods accept TCP on the webhook port and never answer.
		{Class: watchprobe.Class{Name: "timeout", Key: "timeout", Check: "KD409", Alert: "KadmitWebhookTLSBroken", HSReason: "timeout"},
			fault: rollout(webhookArgs(func(a []string) []string { return setArg(a, "--stall", "--stall") }),
				webhookArgs(func(a []string) []string { return dropArg(a, "--stall") }))},

		// Issue 23's classes.

		// Argo CD (Replace=true, or a manifest with a stale caBundle)
		// against cert-manager's cainjector: every second the GitOps side
		// writes its caBundle back, the injector repairs it.
		{Class: watchprobe.Class{Name: "field-manager fight over caBundle", Key: "fight", Check: "KD609", Informer: true, Severities: newSeverities, Persists: true},
			fault: func(t *testing.T, b *backend) watchprobe.Fault { return fightFault(t, b) }},
		// Three mutating webhooks of 30 s on pod creations in sequence, and
		// a validating one of 30 s: 120 s for one pod creation.
		{Class: watchprobe.Class{Name: "timeout budget", Key: "budget", Check: "KD608", Informer: true, Severities: newSeverities},
			prepare: func(ctx context.Context, _ *testing.T, b *backend) error {
				return ensureNamespace(ctx, b.c, budgetTargetNS, ignored)
			},
			fault: budgetFault},
		// A Fail webhook on pod creations in the namespace of a DaemonSet
		// laid out as a CNI plugin's (host network, /etc/cni/net.d and
		// /opt/cni/bin from the host).
		{Class: watchprobe.Class{Name: "dependency deadlock (CNI)", Key: "deadlock", Check: "KD506", Informer: true, Severities: newSeverities},
			prepare: func(ctx context.Context, _ *testing.T, b *backend) error { return createCNIDaemonSet(ctx, b.c) },
			fault: configChange(func(w *admissionregistrationv1.ValidatingWebhook) {
				w.Rules = []admissionregistrationv1.RuleWithOperations{podCreate}
				w.NamespaceSelector = inNamespace(cniNS)
			}, restoreRules)},
		// A release that drops the preStop delay: every rollout from then
		// on ends pods the API server still calls (kubernetes #127335).
		// The fault is the Deployment's template (the check reads it; the
		// next rollout, drain or eviction is the outage), in effect once
		// the Deployment is updated.
		{Class: watchprobe.Class{Name: "terminating endpoints (no preStop)", Key: "noprestop", Check: "KD203", Informer: true, Severities: newSeverities},
			fault: func(_ *testing.T, b *backend) watchprobe.Fault {
				return watchprobe.Fault{Subjects: single(b),
					Inject: func(ctx context.Context) (time.Time, error) {
						return time.Time{}, b.updateTemplate(ctx, func(s *corev1.PodSpec) { s.Containers[0].Lifecycle = nil })
					},
					Repair: func(ctx context.Context) error {
						return b.updateTemplate(ctx, func(s *corev1.PodSpec) {
							s.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: preStopSleep}}}
						})
					}}
			}},
		// A NetworkPolicy selecting the webhook's pods that admits only
		// other pods: not the API server (the cluster's CNI does not
		// enforce it; the check reads it). The pods run on node2: the API
		// server runs on node1 (its address is node1's), and traffic from
		// a pod's own node is always allowed (the NetworkPolicy API's
		// documented semantics, which KD107 follows), so a policy cannot
		// block the API server's calls to pods on node1.
		{Class: watchprobe.Class{Name: "NetworkPolicy blocks the API server", Key: "netpol", Check: "KD107", Informer: true, Severities: newSeverities}, onNode2: true,
			fault: func(_ *testing.T, b *backend) watchprobe.Fault {
				np := &networkingv1.NetworkPolicy{
					ObjectMeta: metav1.ObjectMeta{Name: "only-clients", Namespace: b.ns},
					Spec: networkingv1.NetworkPolicySpec{
						PodSelector: metav1.LabelSelector{MatchLabels: b.labels()},
						PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
						Ingress: []networkingv1.NetworkPolicyIngressRule{{
							From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
							Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromString(webhookPortName))}},
						}},
					},
				}
				api := b.c.Client.NetworkingV1().NetworkPolicies(b.ns)
				return watchprobe.Fault{Subjects: single(b),
					Inject: func(ctx context.Context) (time.Time, error) {
						_, err := api.Create(ctx, np, metav1.CreateOptions{FieldManager: backendFieldManager})
						return time.Time{}, err
					},
					Repair: func(ctx context.Context) error { return api.Delete(ctx, np.Name, metav1.DeleteOptions{}) }}
			}},
		// Rules on TokenReview: on 1.37 (ExcludeAdmissionWebhookVirtualResources
		// on by default) the API server never calls webhooks for them.
		// internal/doctor reports it as info (the rule is dead, nothing
		// fails): a metric, no Event, no alert.
		{Class: watchprobe.Class{Name: "rules on a virtual resource (1.37)", Key: "virtual", Check: "KD610", Informer: true, Severities: []string{"info"}},
			fault: configChange(func(w *admissionregistrationv1.ValidatingWebhook) {
				w.Rules = []admissionregistrationv1.RuleWithOperations{tokenReviewCreate}
			}, restoreRules)},
	}
}

// Field managers of the fight, as the two controllers name themselves.
const (
	cainjectorManager = "cert-manager-cainjector"
	argoManager       = "argocd-controller"
)

// applyCABundle writes the webhook's caBundle by server-side apply as
// manager, taking the field over (force), as cert-manager's cainjector and
// Argo CD's server-side sync do.
func applyCABundle(ctx context.Context, c *cluster.Cluster, cfg, webhook string, ca []byte, manager string) error {
	ac := admissionregistrationv1ac.ValidatingWebhookConfiguration(cfg).WithWebhooks(
		admissionregistrationv1ac.ValidatingWebhook().WithName(webhook).WithClientConfig(admissionregistrationv1ac.WebhookClientConfig().WithCABundle(ca...)))
	_, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Apply(ctx, ac, metav1.ApplyOptions{FieldManager: manager, Force: true})
	return err
}

// fight bounds: the GitOps side writes every second, the injector checks
// every 200 ms; each at most this many times (a fight is measured within
// about a minute).
const (
	fightPeriod    = time.Second
	injectPeriod   = 200 * time.Millisecond
	maxFightWrites = 120
	maxInjectLoops = 900
)

// fightFault starts, at injection, cainjector (repairs the caBundle to the
// backend's CA whenever it differs) and the GitOps side (writes a stale
// CA every second); the repair stops the GitOps side and waits for the
// injector's last repair.
func fightFault(t *testing.T, b *backend) watchprobe.Fault {
	stale := newTestCA(t).pem
	var (
		cancel       context.CancelFunc
		wg           sync.WaitGroup
		stopGitOps   = make(chan struct{})
		gitOpsWrites atomic.Int32
		injects      atomic.Int32
		errMu        sync.Mutex
		firstErr     error
	)
	fail := func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	return watchprobe.Fault{Subjects: []watchprobe.Subject{{Configuration: b.name, Webhook: b.webhook}},
		Inject: func(ctx context.Context) (time.Time, error) {
			var lctx context.Context
			lctx, cancel = context.WithTimeout(context.Background(), 3*time.Minute)
			t.Cleanup(func() { cancel(); wg.Wait() })
			wg.Add(2)
			go func() { // cainjector
				defer wg.Done()
				tick := time.NewTicker(injectPeriod)
				defer tick.Stop()
				for range maxInjectLoops {
					if ok, err := b.caBundleIs(lctx, b.ca.pem); err != nil && lctx.Err() == nil {
						fail(fmt.Errorf("cainjector read: %w", err))
					} else if !ok {
						if err := applyCABundle(lctx, b.c, b.name, b.webhook, b.ca.pem, cainjectorManager); err != nil && lctx.Err() == nil {
							fail(fmt.Errorf("cainjector apply: %w", err))
						}
						injects.Add(1)
					}
					select {
					case <-lctx.Done():
						return
					case <-tick.C:
					}
				}
			}()
			first := make(chan time.Time, 1)
			go func() { // the GitOps side
				defer wg.Done()
				tick := time.NewTicker(fightPeriod)
				defer tick.Stop()
				for range maxFightWrites {
					if err := applyCABundle(lctx, b.c, b.name, b.webhook, stale, argoManager); err != nil && lctx.Err() == nil {
						fail(fmt.Errorf("GitOps apply: %w", err))
					} else if gitOpsWrites.Add(1) == 1 {
						first <- time.Now()
					}
					select {
					case <-lctx.Done():
						return
					case <-stopGitOps:
						return
					case <-tick.C:
					}
				}
			}()
			select {
			case at := <-first:
				return at, nil
			case <-ctx.Done():
				return time.Time{}, ctx.Err()
			case <-time.After(30 * time.Second):
				errMu.Lock()
				defer errMu.Unlock()
				return time.Time{}, fmt.Errorf("the GitOps side wrote nothing in 30s: %v", firstErr)
			}
		},
		Repair: func(ctx context.Context) error {
			close(stopGitOps)
			err := poll.Until(ctx, 30*time.Second, func(ctx context.Context) error {
				ok, err := b.caBundleIs(ctx, b.ca.pem)
				if err == nil && !ok {
					err = errors.New("caBundle not repaired yet")
				}
				return err
			})
			cancel()
			wg.Wait()
			t.Logf("fight: %d writes by %s, %d repairs by %s", gitOpsWrites.Load(), argoManager, injects.Load(), cainjectorManager)
			errMu.Lock()
			defer errMu.Unlock()
			return errors.Join(err, firstErr)
		}}
}

// budgetFault: the backend's validating webhook and a mutating
// configuration of three webhooks, all on pod creations in budgetTargetNS
// with timeoutSeconds 30.
func budgetFault(_ *testing.T, b *backend) watchprobe.Fault {
	mname := b.name + "-mutating"
	mutating := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: mname}}
	for i := 1; i <= 3; i++ {
		mutating.Webhooks = append(mutating.Webhooks, admissionregistrationv1.MutatingWebhook{
			Name:                    fmt.Sprintf("m%d.%s", i, b.webhook),
			ClientConfig:            b.clientConfig("/mutate", b.ca.pem),
			Rules:                   []admissionregistrationv1.RuleWithOperations{podCreate},
			NamespaceSelector:       inNamespace(budgetTargetNS),
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](30),
			ReinvocationPolicy:      ptr.To(admissionregistrationv1.NeverReinvocationPolicy),
		})
	}
	api := b.c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	return watchprobe.Fault{
		Subjects: []watchprobe.Subject{{Configuration: b.name, Webhook: b.webhook}, {Configuration: mname}},
		Inject: func(ctx context.Context) (time.Time, error) {
			if _, err := api.Create(ctx, mutating, metav1.CreateOptions{FieldManager: backendFieldManager}); err != nil {
				return time.Time{}, err
			}
			return time.Time{}, b.updateConfig(ctx, func(w *admissionregistrationv1.ValidatingWebhook) {
				w.Rules = []admissionregistrationv1.RuleWithOperations{podCreate}
				w.NamespaceSelector = inNamespace(budgetTargetNS)
				w.TimeoutSeconds = ptr.To[int32](30)
			})
		},
		Repair: func(ctx context.Context) error {
			if err := api.Delete(ctx, mname, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			return b.updateConfig(ctx, func(w *admissionregistrationv1.ValidatingWebhook) {
				w.Rules = []admissionregistrationv1.RuleWithOperations{configMapCreate}
				w.NamespaceSelector = inNamespace(b.ns)
				w.TimeoutSeconds = ptr.To[int32](5)
			})
		}}
}

// createCNIDaemonSet makes namespace cniNS (labelled out of kadmit's
// webhooks, as an operator excludes the CNI's namespace) and a DaemonSet
// laid out as a CNI plugin's: host network, /etc/cni/net.d and /opt/cni/bin
// from the host, tolerating every taint. Its nodeSelector matches no node,
// so no pod of it runs: the nodes' network here is the cluster harness's,
// and a pod must not touch the host's /etc or /opt; the check reads the
// DaemonSet's pod template, which is what a re-created pod carries.
func createCNIDaemonSet(ctx context.Context, c *cluster.Cluster) error {
	if err := ensureNamespace(ctx, c, cniNS, ignored); err != nil {
		return err
	}
	lbls := map[string]string{"k8s-app": "cni-agent"}
	hostPath := func(name, path string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: ptr.To(corev1.HostPathDirectory)}}}
	}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "cni-agent", Namespace: cniNS, Labels: lbls},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: lbls},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: lbls},
				Spec: corev1.PodSpec{
					HostNetwork:  true,
					NodeSelector: map[string]string{"kadmit.test/no-such-node": "true"},
					Tolerations:  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{
						Name: "cni", Image: cluster.PauseRef, ImagePullPolicy: corev1.PullNever,
						VolumeMounts: []corev1.VolumeMount{{Name: "cni-conf", MountPath: "/etc/cni/net.d", ReadOnly: true}, {Name: "cni-bin", MountPath: "/opt/cni/bin", ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{hostPath("cni-conf", "/etc/cni/net.d"), hostPath("cni-bin", "/opt/cni/bin")},
				},
			},
		},
	}
	if _, err := c.Client.AppsV1().DaemonSets(cniNS).Create(ctx, ds, metav1.CreateOptions{FieldManager: backendFieldManager}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("DaemonSet %s/cni-agent: %w", cniNS, err)
	}
	return nil
}

// caBundleOwners returns, per field manager, whether its managedFields
// entry of configuration obj owns a caBundle.
func caBundleOwners(mf []metav1.ManagedFieldsEntry) map[string]bool {
	out := map[string]bool{}
	for _, e := range mf {
		if e.FieldsV1 != nil && strings.Contains(e.FieldsV1.GetRawString(), `"f:caBundle"`) {
			out[e.Manager] = true
		}
	}
	return out
}
