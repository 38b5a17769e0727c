package diagcluster

// The healthy cluster of NoFalseAlarms, next to kadmit: a Kueue-like
// controller whose caBundle its own certificate controller injects, a
// LeaderWorkerSet-like controller whose caBundle a cert-manager-like
// injector writes, and an Argo CD-like GitOps controller re-applying the
// unchanged webhook configurations. Stand-ins, said plainly:
//
//   - the controllers' pods are ./webhook (they admit everything); what the
//     watch checks (Services, EndpointSlices, certificates, caBundles,
//     PodDisruptionBudgets, preStop) is laid out as their charts lay it
//     out, with three Kueue replicas and a preStop delay, so that a drain
//     keeps two ready (a Fail webhook with one ready endpoint is KD604, a
//     true finding);
//   - the Kueue-like certificate controller (open-policy-agent/
//     cert-controller's job: a CA and serving certificate in a Secret, the
//     caBundle injected by an Update, re-injected whenever it differs) runs
//     in the test process, as its leader replica would, field manager
//     kueue-cert-controller;
//   - cert-manager is its Certificate CRD and a Certificate (so the watch's
//     KD411 check reads what it reads on a real cluster), a Secret issued by
//     the test, and cainjector: the test process writing ca.crt into the
//     caBundle by server-side apply, field manager cert-manager-cainjector,
//     for the configuration annotated cert-manager.io/inject-ca-from;
//   - Argo CD is a loop applying the configurations' manifests (without
//     caBundle, as a chart renders them when cainjector or the controller
//     injects it) by server-side apply, field manager argocd-controller,
//     without forcing: a conflict would be an error.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/kadmit/kadmit/pkg/webhookcerts"
	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/poll"
)

const (
	kueueNS      = "kueue-system"
	kueueService = "kueue-webhook-service"
	kueueSecret  = "kueue-webhook-server-cert"
	kueueMCfg    = "kueue-mutating-webhook-configuration"
	kueueVCfg    = "kueue-validating-webhook-configuration"
	kueueManager = "kueue-cert-controller"
	kueueReplica = 3

	lwsNS       = "lws-system"
	lwsService  = "lws-webhook-service"
	lwsSecret   = "lws-webhook-server-cert"
	lwsCert     = "lws-serving-cert"
	lwsVCfg     = "lws-validating-webhook-configuration"
	lwsReplicas = 2
)

var (
	kueueLabels = map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "kueue"}
	lwsLabels   = map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": "lws"}
)

// notIn is a namespaceSelector excluding namespaces, as the controllers'
// charts exclude kube-system and their own.
func notIn(ns ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: ns}}}
}

func serviceRef(ns, name, path string) admissionregistrationv1.WebhookClientConfig {
	return admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: name, Port: ptr.To[int32](443), Path: ptr.To(path)}}
}

var jobRules = []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
	Rule: admissionregistrationv1.Rule{APIGroups: []string{"batch"}, APIVersions: []string{"v1"}, Resources: []string{"jobs"}}}}

// kueueConfigs are the Kueue-like controller's configurations as its chart
// renders them (no caBundle: the controller injects it).
func kueueConfigs() (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration) {
	m := &admissionregistrationv1.MutatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: kueueMCfg, Labels: map[string]string{"app.kubernetes.io/name": "kueue"}},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "mjob.kb.io", ClientConfig: serviceRef(kueueNS, kueueService, "/mutate-batch-v1-job"),
			Rules: jobRules, NamespaceSelector: notIn("kube-system", kueueNS),
			FailurePolicy: ptr.To(admissionregistrationv1.Fail), SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: ptr.To[int32](10),
		}},
	}
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: kueueVCfg, Labels: map[string]string{"app.kubernetes.io/name": "kueue"}},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "vjob.kb.io", ClientConfig: serviceRef(kueueNS, kueueService, "/validate-batch-v1-job"),
			Rules: jobRules, NamespaceSelector: notIn("kube-system", kueueNS),
			FailurePolicy: ptr.To(admissionregistrationv1.Fail), SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: ptr.To[int32](10),
		}},
	}
	return m, v
}

// lwsConfig is the LeaderWorkerSet-like configuration, annotated for
// cert-manager's cainjector (failurePolicy Ignore, as many are).
func lwsConfig() *admissionregistrationv1.ValidatingWebhookConfiguration {
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: lwsVCfg, Labels: map[string]string{"app.kubernetes.io/name": "lws"},
			Annotations: map[string]string{"cert-manager.io/inject-ca-from": lwsNS + "/" + lwsCert}},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "vstatefulset.lws.x-k8s.io", ClientConfig: serviceRef(lwsNS, lwsService, "/validate-apps-v1-statefulset"),
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"v1"}, Resources: []string{"statefulsets"}}}},
			NamespaceSelector: notIn("kube-system", lwsNS),
			FailurePolicy:     ptr.To(admissionregistrationv1.Ignore), SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: ptr.To[int32](10),
		}},
	}
}

// products are the two controllers and their injectors.
type products struct {
	c        *cluster.Cluster
	kueueCA  *testCA
	lwsCA    *testCA
	certCtl  *loop // Kueue-like certificate controller
	injector *loop // cert-manager-like cainjector
}

// createProducts creates both controllers' Secrets, Deployments, Services
// and PodDisruptionBudgets, cert-manager's CRD and Certificate; the
// configurations come from Argo (startArgo), their caBundles from the
// loops startInjectors starts.
func createProducts(ctx context.Context, t *testing.T, c *cluster.Cluster) (*products, error) {
	p := &products{c: c, kueueCA: newTestCA(t), lwsCA: newTestCA(t)}
	cs := c.Client
	create := metav1.CreateOptions{}
	for _, x := range []struct {
		ns, svc, secret string
		ca              *testCA
		labels          map[string]string
		replicas        int32
		pdb             policyv1.PodDisruptionBudgetSpec
	}{
		{kueueNS, kueueService, kueueSecret, p.kueueCA, kueueLabels, kueueReplica, policyv1.PodDisruptionBudgetSpec{MaxUnavailable: ptr.To(intstr.FromInt32(1))}},
		{lwsNS, lwsService, lwsSecret, p.lwsCA, lwsLabels, lwsReplicas, policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1))}},
	} {
		if err := ensureNamespace(ctx, c, x.ns, ignored); err != nil {
			return nil, err
		}
		if _, err := cs.CoreV1().Secrets(x.ns).Create(ctx, x.ca.secret(t, x.ns, x.secret, x.svc+"."+x.ns+".svc", time.Now(), healthyValidity), create); err != nil {
			return nil, fmt.Errorf("Secret %s/%s: %w", x.ns, x.secret, err)
		}
		name := x.labels["app.kubernetes.io/name"] + "-controller-manager"
		if _, err := cs.AppsV1().Deployments(x.ns).Create(ctx, webhookDeployment(x.ns, name, x.labels, x.replicas, x.secret, nil), create); err != nil {
			return nil, fmt.Errorf("Deployment %s/%s: %w", x.ns, name, err)
		}
		if _, err := cs.CoreV1().Services(x.ns).Create(ctx, webhookService(x.ns, x.svc, x.labels), create); err != nil {
			return nil, fmt.Errorf("Service %s/%s: %w", x.ns, x.svc, err)
		}
		x.pdb.Selector = &metav1.LabelSelector{MatchLabels: x.labels}
		if _, err := cs.PolicyV1().PodDisruptionBudgets(x.ns).Create(ctx, &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: x.ns}, Spec: x.pdb}, create); err != nil {
			return nil, fmt.Errorf("PodDisruptionBudget %s/%s: %w", x.ns, name, err)
		}
	}
	return p, createCertificate(ctx, c)
}

var (
	crdGVR  = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	certGVR = schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "certificates"}
)

// createCertificate installs cert-manager's Certificate CRD (its names and
// version; the schema left open) and the Certificate whose Secret the
// LWS-like pods serve.
func createCertificate(ctx context.Context, c *cluster.Cluster) error {
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "certificates.cert-manager.io"},
		"spec": map[string]any{
			"group": "cert-manager.io", "scope": "Namespaced",
			"names": map[string]any{"plural": "certificates", "singular": "certificate", "kind": "Certificate", "listKind": "CertificateList"},
			"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		},
	}}
	if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("Certificate CRD: %w", err)
	}
	cert := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
		"metadata": map[string]any{"name": lwsCert, "namespace": lwsNS},
		"spec": map[string]any{"secretName": lwsSecret, "dnsNames": []any{lwsService + "." + lwsNS + ".svc"},
			"issuerRef": map[string]any{"name": "lws-selfsigned-issuer", "kind": "Issuer"}},
	}}
	// The CRD is served a moment after it is created.
	return poll.Until(ctx, 30*time.Second, func(ctx context.Context) error {
		_, err := dyn.Resource(certGVR).Namespace(lwsNS).Create(ctx, cert, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
}

// startInjectors starts the Kueue-like certificate controller and
// cainjector; both stop when t ends.
func (p *products) startInjectors(t *testing.T) {
	reg := p.c.Client.AdmissionregistrationV1()
	p.certCtl = startLoop(t, "kueue certificate controller", time.Second, func(ctx context.Context) (int, error) {
		writes := 0
		m, err := reg.MutatingWebhookConfigurations().Get(ctx, kueueMCfg, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return 0, nil // Argo has not created it yet
		}
		if err != nil {
			return 0, err
		}
		if stale := bundleStale(len(m.Webhooks), func(i int) []byte { return m.Webhooks[i].ClientConfig.CABundle }, p.kueueCA.pem); stale {
			for i := range m.Webhooks {
				m.Webhooks[i].ClientConfig.CABundle = p.kueueCA.pem
			}
			if _, err := reg.MutatingWebhookConfigurations().Update(ctx, m, metav1.UpdateOptions{FieldManager: kueueManager}); err != nil {
				return writes, err
			}
			writes++
		}
		v, err := reg.ValidatingWebhookConfigurations().Get(ctx, kueueVCfg, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return writes, nil
		}
		if err != nil {
			return writes, err
		}
		if stale := bundleStale(len(v.Webhooks), func(i int) []byte { return v.Webhooks[i].ClientConfig.CABundle }, p.kueueCA.pem); stale {
			for i := range v.Webhooks {
				v.Webhooks[i].ClientConfig.CABundle = p.kueueCA.pem
			}
			if _, err := reg.ValidatingWebhookConfigurations().Update(ctx, v, metav1.UpdateOptions{FieldManager: kueueManager}); err != nil {
				return writes, err
			}
			writes++
		}
		return writes, nil
	})
	p.injector = startLoop(t, "cainjector", time.Second, func(ctx context.Context) (int, error) {
		s, err := p.c.Client.CoreV1().Secrets(lwsNS).Get(ctx, lwsSecret, metav1.GetOptions{})
		if err != nil {
			return 0, err
		}
		v, err := reg.ValidatingWebhookConfigurations().Get(ctx, lwsVCfg, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		ca := s.Data["ca.crt"]
		if !bundleStale(len(v.Webhooks), func(i int) []byte { return v.Webhooks[i].ClientConfig.CABundle }, ca) {
			return 0, nil
		}
		for _, w := range v.Webhooks {
			if err := applyCABundle(ctx, p.c, lwsVCfg, w.Name, ca, cainjectorManager); err != nil {
				return 0, err
			}
		}
		return 1, nil
	})
}

func bundleStale(n int, bundle func(int) []byte, want []byte) bool {
	for i := range n {
		if !bytes.Equal(bundle(i), want) {
			return true
		}
	}
	return false
}

// ---------------------------------------------------------------------------
// Argo CD.

// argoManifest is one configuration as the GitOps repository holds it:
// server-side apply YAML (JSON) without caBundle.
type argoManifest struct {
	kind, name string
	body       []byte
}

// manifestOf returns obj (a webhook configuration, typed, with its
// TypeMeta set) as a GitOps repository would hold it: apiVersion, kind,
// metadata name, labels and annotations, and the webhooks without
// caBundle, and without the annotation that goes with an injected caBundle
// (webhookcerts.GenerationAnnotation: the generation of the Secret whose
// bundle kadmit applied, changed by every rotation; a manifest holding it
// conflicts with kadmit's registrar at the first rotation).
func manifestOf(obj any) (argoManifest, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return argoManifest{}, err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return argoManifest{}, err
	}
	meta, _ := m["metadata"].(map[string]any)
	keep := map[string]any{"name": meta["name"]}
	for _, k := range []string{"labels", "annotations"} {
		if v, ok := meta[k]; ok {
			keep[k] = v
		}
	}
	if ann, ok := keep["annotations"].(map[string]any); ok {
		delete(ann, webhookcerts.GenerationAnnotation)
		if len(ann) == 0 {
			delete(keep, "annotations")
		}
	}
	m["metadata"] = keep
	whs, _ := m["webhooks"].([]any)
	for _, w := range whs {
		if cc, ok := w.(map[string]any)["clientConfig"].(map[string]any); ok {
			delete(cc, "caBundle")
		}
	}
	kind, _ := m["kind"].(string)
	if kind == "" {
		return argoManifest{}, errors.New("manifest without kind")
	}
	body, err := json.Marshal(m)
	return argoManifest{kind: kind, name: fmt.Sprint(meta["name"]), body: body}, err
}

// argo applies its manifests every period.
type argo struct {
	mu        sync.Mutex
	manifests []argoManifest
	l         *loop
}

// argoPeriod stands for Argo CD's default reconciliation (timeout.reconciliation
// 180s): 90 times faster.
const argoPeriod = 2 * time.Second

func startArgo(t *testing.T, c *cluster.Cluster, manifests ...argoManifest) *argo {
	a := &argo{manifests: manifests}
	reg := c.Client.AdmissionregistrationV1()
	opts := metav1.PatchOptions{FieldManager: argoManager, Force: ptr.To(false)}
	a.l = startLoop(t, "argo", argoPeriod, func(ctx context.Context) (int, error) {
		a.mu.Lock()
		ms := append([]argoManifest(nil), a.manifests...)
		a.mu.Unlock()
		var errs []error
		for _, m := range ms {
			var err error
			switch m.kind {
			case "MutatingWebhookConfiguration":
				_, err = reg.MutatingWebhookConfigurations().Patch(ctx, m.name, types.ApplyPatchType, m.body, opts)
			case "ValidatingWebhookConfiguration":
				_, err = reg.ValidatingWebhookConfigurations().Patch(ctx, m.name, types.ApplyPatchType, m.body, opts)
			default:
				err = fmt.Errorf("kind %s", m.kind)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("apply %s %s: %w", m.kind, m.name, err))
			}
		}
		return len(ms), errors.Join(errs...)
	})
	return a
}

// add puts more manifests under Argo's management.
func (a *argo) add(ms ...argoManifest) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.manifests = append(a.manifests, ms...)
}

// ---------------------------------------------------------------------------
// Loops.

// maxLoopRuns bounds every background loop's iterations (about 15 minutes
// at one per second, past the package's timeout budget).
const maxLoopRuns = 900

// loop runs fn every period until stopped (or t ends, or maxLoopRuns),
// counting runs, what fn reports it wrote, and errors.
type loop struct {
	name   string
	cancel context.CancelFunc
	done   chan struct{}
	runs   atomic.Int64
	writes atomic.Int64
	errs   atomic.Int64
	mu     sync.Mutex
	first  error
}

func startLoop(t *testing.T, name string, period time.Duration, fn func(context.Context) (int, error)) *loop {
	return startLoopN(t, name, period, maxLoopRuns, fn)
}

// startLoopN is startLoop with at most maxRuns iterations.
func startLoopN(t *testing.T, name string, period time.Duration, maxRuns int, fn func(context.Context) (int, error)) *loop {
	ctx, cancel := context.WithCancel(context.Background())
	l := &loop{name: name, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for range maxRuns {
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			n, err := fn(rctx)
			rcancel()
			if ctx.Err() != nil {
				return
			}
			l.runs.Add(1)
			l.writes.Add(int64(n))
			if err != nil {
				l.errs.Add(1)
				l.mu.Lock()
				if l.first == nil {
					l.first = err
				}
				l.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(l.stop)
	return l
}

// stop ends the loop and waits for it.
func (l *loop) stop() {
	l.cancel()
	<-l.done
}

// firstErr is the loop's first error.
func (l *loop) firstErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.first
}

func (l *loop) String() string {
	return fmt.Sprintf("%s: %d runs, %d writes, %d errors (first: %v)", l.name, l.runs.Load(), l.writes.Load(), l.errs.Load(), l.firstErr())
}
