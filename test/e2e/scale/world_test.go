package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kadmit/kadmit/internal/bench"
	"github.com/kadmit/kadmit/pkg/webhookcerts"
	"github.com/kadmit/kadmit/test/e2e/e2eenv"
)

// The cluster's shape: issue 23's 500 configurations, 2,000 Services and
// 50,000 pods. Each namespace holds hooksPerNS webhook Services, each in
// front of a webhook Deployment of hookReplicas pods, and appsPerNS
// application Deployments of appReplicas pods that no webhook calls:
// 100 × (20 × 2 + 10 × 46) = 50,000 pods, 4,000 of them behind a webhook
// Service. Configuration c calls the 4 Services 4(c mod 5) .. 4(c mod 5)+3
// of namespace c/5: every Service is called by exactly one webhook.
const (
	namespaces      = 100
	hooksPerNS      = 20
	hookReplicas    = 2
	appsPerNS       = 10
	appReplicas     = 46
	configs         = namespaces * hooksPerNS / hooksPerConfig
	hooksPerConfig  = 4
	wantPods        = namespaces * (hooksPerNS*hookReplicas + appsPerNS*appReplicas)
	wantServices    = namespaces * hooksPerNS
	wantWebhooks    = configs * hooksPerConfig
	webhookPort     = 9443
	templateHashLen = 10
)

// createWorkers bounds the creates in flight: enough to keep the API
// server and etcd busy on two cores (the rate, 450 objects a second on an
// idle machine, is their CPU), few enough that none waits long in the API
// server's queue. No limit of the control plane needs raising: the admin
// client is in system:masters, which API Priority and Fairness exempts, so
// --max-requests-inflight does not throttle it, and etcd runs with its
// default 2 GiB backend quota (envtest sets none), far above what 58,600
// objects of a few KB take.
const createWorkers = 24

// parallel runs f(ctx, i) for i in [0, n) on at most workers goroutines
// and returns the first error; the others stop taking work then. done
// counts the calls that returned nil.
func parallel(ctx context.Context, n, workers int, done *atomic.Int64, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := range next {
				if err := f(ctx, i); err != nil {
					cancel(err)
					continue
				}
				done.Add(1)
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && err != context.Canceled {
		return err
	}
	return nil
}

// createClient is a client for the creates: protobuf, as kube-controller-
// manager sends, and a rate limit far above what the control plane serves,
// so that the worker pool alone bounds the load.
func createClient(t *testing.T, e *e2eenv.Env) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(e.Config)
	cfg.QPS, cfg.Burst = 10_000, 10_000
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// workload is one Deployment of the world, with its ReplicaSet.
type workload struct {
	ns, name, hash string
	replicas       int
	hook           bool // behind a webhook Service
	deployUID      types.UID
	rsUID          types.UID
}

func (w *workload) rsName() string { return w.name + "-" + w.hash }

// labels are those of the pods (and the template): bench's pod labels,
// with the workload's name and template hash.
func (w *workload) labels(base map[string]string) map[string]string {
	l := make(map[string]string, len(base))
	for k, v := range base {
		l[k] = v
	}
	l["app.kubernetes.io/name"] = w.name
	l["app.kubernetes.io/instance"] = w.name + "-prod"
	l[appsv1.DefaultDeploymentUniqueLabelKey] = w.hash
	return l
}

// world is the cluster built by build, with the creation figures.
type world struct {
	nss       []string
	workloads []*workload
	configs   []string
	objects   int64         // objects created
	took      time.Duration // creating them
}

// podShape returns bench's pod (a Deployment's pod as its ReplicaSet
// creates it, with the default tolerations) and the same with the first
// container serving the webhook port, for webhook Deployments.
func podShape(t *testing.T) (app, hook *corev1.Pod) {
	t.Helper()
	app = &corev1.Pod{}
	if err := json.Unmarshal(bench.APIServerPod(), app); err != nil {
		t.Fatalf("decode bench.APIServerPod: %v", err)
	}
	app.GenerateName, app.OwnerReferences = "", nil
	hook = app.DeepCopy()
	hook.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "https", ContainerPort: webhookPort, Protocol: corev1.ProtocolTCP}}
	return app, hook
}

// build creates the world: namespaces, Deployments, their ReplicaSets,
// pods and webhook Services, then the configurations (last, since their
// Fail webhooks intercept pod creates and no endpoint exists).
func build(ctx context.Context, t *testing.T, e *e2eenv.Env, sfx string) *world {
	t.Helper()
	cs := createClient(t, e)
	appPod, hookPod := podShape(t)
	w := &world{}
	var created atomic.Int64
	start := time.Now()
	step := func(what string, n int, f func(ctx context.Context, i int) error) {
		t.Helper()
		s, before := time.Now(), created.Load()
		if err := parallel(ctx, n, createWorkers, &created, f); err != nil {
			t.Fatalf("create %s (%d of %d done): %v", what, created.Load()-before, n, err)
		}
		d := time.Since(s)
		t.Logf("created %d %s in %s (%.0f/s)", n, what, d.Round(time.Millisecond), float64(n)/d.Seconds())
	}

	for i := range namespaces {
		w.nss = append(w.nss, fmt.Sprintf("scale-%s-%03d", sfx, i))
	}
	step("namespaces", namespaces, func(ctx context.Context, i int) error {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.nss[i]}}, metav1.CreateOptions{})
		return err
	})
	for n, ns := range w.nss {
		for h := range hooksPerNS {
			w.workloads = append(w.workloads, &workload{ns: ns, name: fmt.Sprintf("hook-%02d", h), hash: hash(n, h), replicas: hookReplicas, hook: true})
		}
		for a := range appsPerNS {
			w.workloads = append(w.workloads, &workload{ns: ns, name: fmt.Sprintf("app-%02d", a), hash: hash(n, hooksPerNS+a), replicas: appReplicas})
		}
	}
	template := func(wl *workload) corev1.PodTemplateSpec {
		p := appPod
		if wl.hook {
			p = hookPod
		}
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: wl.labels(p.Labels), Annotations: p.Annotations}, Spec: p.Spec}
	}
	step("Deployments", len(w.workloads), func(ctx context.Context, i int) error {
		wl := w.workloads[i]
		tpl := template(wl)
		delete(tpl.Labels, appsv1.DefaultDeploymentUniqueLabelKey)
		d, err := cs.AppsV1().Deployments(wl.ns).Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: wl.name, Labels: map[string]string{"app.kubernetes.io/name": wl.name}},
			Spec: appsv1.DeploymentSpec{Replicas: ptr(int32(wl.replicas)), Template: tpl,
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": wl.name}}},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("Deployment %s/%s: %w", wl.ns, wl.name, err)
		}
		wl.deployUID = d.UID
		return nil
	})
	step("ReplicaSets", len(w.workloads), func(ctx context.Context, i int) error {
		wl := w.workloads[i]
		tpl := template(wl)
		rs, err := cs.AppsV1().ReplicaSets(wl.ns).Create(ctx, &appsv1.ReplicaSet{
			ObjectMeta: metav1.ObjectMeta{Name: wl.rsName(), Labels: tpl.Labels, OwnerReferences: []metav1.OwnerReference{
				{APIVersion: "apps/v1", Kind: "Deployment", Name: wl.name, UID: wl.deployUID, Controller: ptr(true), BlockOwnerDeletion: ptr(true)}}},
			Spec: appsv1.ReplicaSetSpec{Replicas: ptr(int32(wl.replicas)), Template: tpl,
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": wl.name, appsv1.DefaultDeploymentUniqueLabelKey: wl.hash}}},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("ReplicaSet %s/%s: %w", wl.ns, wl.rsName(), err)
		}
		wl.rsUID = rs.UID
		return nil
	})
	// Pods and Services in one pool: pod i of the flat list, then the
	// Services after the last pod.
	type podRef struct {
		wl *workload
		i  int
	}
	var pods []podRef
	for _, wl := range w.workloads {
		for i := range wl.replicas {
			pods = append(pods, podRef{wl, i})
		}
	}
	if len(pods) != wantPods {
		t.Fatalf("%d pods planned, want %d", len(pods), wantPods)
	}
	var hooks []*workload
	for _, wl := range w.workloads {
		if wl.hook {
			hooks = append(hooks, wl)
		}
	}
	step("pods and webhook Services", len(pods)+len(hooks), func(ctx context.Context, i int) error {
		if i >= len(pods) {
			wl := hooks[i-len(pods)]
			// Headless: 2,000 ClusterIPs would exhaust the control plane's
			// service range; the checks read the selector and ports only.
			_, err := cs.CoreV1().Services(wl.ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: wl.name}, Spec: corev1.ServiceSpec{
				ClusterIP: corev1.ClusterIPNone, Selector: map[string]string{"app.kubernetes.io/name": wl.name},
				Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(webhookPort), Protocol: corev1.ProtocolTCP}},
			}}, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("Service %s/%s: %w", wl.ns, wl.name, err)
			}
			return nil
		}
		p := pods[i]
		shape := appPod
		if p.wl.hook {
			shape = hookPod
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Name:        fmt.Sprintf("%s-%05d", p.wl.rsName(), p.i),
			Labels:      p.wl.labels(shape.Labels),
			Annotations: shape.Annotations,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: p.wl.rsName(), UID: p.wl.rsUID,
				Controller: ptr(true), BlockOwnerDeletion: ptr(true)}},
		}, Spec: shape.Spec}
		if _, err := cs.CoreV1().Pods(p.wl.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("pod %s/%s: %w", p.wl.ns, pod.Name, err)
		}
		return nil
	})

	caCert, _, err := webhookcerts.NewCA(time.Now(), 24*time.Hour, webhookcerts.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	bundle := webhookcerts.EncodeCertificates(caCert)
	for c := range configs {
		w.configs = append(w.configs, fmt.Sprintf("scale-%s-%03d", sfx, c))
	}
	step("webhook configurations", configs, func(ctx context.Context, c int) error {
		name := w.configs[c]
		ns := w.nss[c/(hooksPerNS/hooksPerConfig)]
		var vhooks []admissionregistrationv1.ValidatingWebhook
		var mhooks []admissionregistrationv1.MutatingWebhook
		for h := range hooksPerConfig {
			svc := fmt.Sprintf("hook-%02d", hooksPerConfig*(c%(hooksPerNS/hooksPerConfig))+h)
			v := validatingHook(c, h, ns, svc, bundle)
			if c%2 == 0 {
				vhooks = append(vhooks, v)
				continue
			}
			mhooks = append(mhooks, admissionregistrationv1.MutatingWebhook{Name: v.Name, ClientConfig: v.ClientConfig, Rules: v.Rules,
				FailurePolicy: v.FailurePolicy, MatchPolicy: v.MatchPolicy, NamespaceSelector: v.NamespaceSelector, ObjectSelector: v.ObjectSelector,
				SideEffects: v.SideEffects, TimeoutSeconds: v.TimeoutSeconds, AdmissionReviewVersions: v.AdmissionReviewVersions,
				MatchConditions: v.MatchConditions, ReinvocationPolicy: ptr(admissionregistrationv1.IfNeededReinvocationPolicy)})
		}
		var err error
		if c%2 == 0 {
			_, err = cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx,
				&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}, Webhooks: vhooks}, metav1.CreateOptions{})
		} else {
			_, err = cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx,
				&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}, Webhooks: mhooks}, metav1.CreateOptions{})
		}
		if err != nil {
			return fmt.Errorf("configuration %s: %w", name, err)
		}
		return nil
	})
	w.took, w.objects = time.Since(start), created.Load()
	return w
}

// validatingHook is webhook h of configuration c, calling Service ns/svc:
// what operators' webhooks look like. Most validate or default their own
// custom resources (webhooks 0 and 1, 1 with a matchCondition; 2 and 3
// too); one configuration in ten is a sidecar injector's, whose webhook 2
// intercepts pods of the namespaces labelled for injection (none here)
// and webhook 3 ConfigMaps in its own namespace; one in a hundred is a
// policy engine's, whose webhooks 2 and 3 intercept every pod and
// Deployment outside kube-system and its own namespace. Even
// configurations are Fail, odd ones Ignore; the policy engines are Fail.
func validatingHook(c, h int, ns, svc string, bundle []byte) admissionregistrationv1.ValidatingWebhook {
	fp := admissionregistrationv1.Ignore
	if c%2 == 0 {
		fp = admissionregistrationv1.Fail
	}
	group := fmt.Sprintf("c%03d.scale.example.com", c)
	rule := admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{"v1"}, Resources: []string{[]string{"widgets", "gadgets", "things", "doohickeys"}[h]}}
	var nsSel *metav1.LabelSelector
	var conds []admissionregistrationv1.MatchCondition
	if h == 1 {
		conds = []admissionregistrationv1.MatchCondition{{Name: "not-skipped",
			Expression: `!has(object.metadata.labels) || !('scale.example.com/skip' in object.metadata.labels)`}}
	}
	switch {
	case c%100 == 0 && h >= 2:
		resource := map[int]string{2: "pods", 3: "deployments"}[h]
		rule = admissionregistrationv1.Rule{APIGroups: []string{map[int]string{2: "", 3: "apps"}[h]}, APIVersions: []string{"v1"}, Resources: []string{resource}}
		nsSel = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: corev1.LabelMetadataName,
			Operator: metav1.LabelSelectorOpNotIn, Values: []string{ns, metav1.NamespaceSystem}}}}
	case c%10 == 5 && h == 2:
		rule = admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}
		nsSel = &metav1.LabelSelector{MatchLabels: map[string]string{"scale.example.com/inject": "enabled"}}
	case c%10 == 5 && h == 3:
		rule = admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}
		nsSel = &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}
	}
	return admissionregistrationv1.ValidatingWebhook{
		Name: fmt.Sprintf("h%d.c%03d.scale.example.com", h, c),
		ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: bundle,
			Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: svc, Path: ptr(fmt.Sprintf("/validate-%d", h)), Port: ptr(int32(443))}},
		Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{
			admissionregistrationv1.Create, admissionregistrationv1.Update}, Rule: rule}},
		FailurePolicy:           &fp,
		NamespaceSelector:       nsSel,
		SideEffects:             ptr(admissionregistrationv1.SideEffectClassNone),
		TimeoutSeconds:          ptr(int32(5)),
		AdmissionReviewVersions: []string{"v1"},
		MatchConditions:         conds,
	}
}

// hash is a pod-template-hash-like name part for workload k of namespace n.
func hash(n, k int) string {
	s := fmt.Sprintf("%x", uint64(n)*1_000_003+uint64(k)*7_919+0x5d8f7c9b6d)
	return s[len(s)-templateHashLen:]
}

func ptr[T any](v T) *T { return &v }
