package routed

// Pod objects for kadmit's own replicas, for the watch e2e. The routed
// harness plays kubelet and endpoints controller without Pod objects (the
// EndpointSlice's targetRefs name pods that do not exist), which leaves
// `kadmit watch`'s owner-chain checks nothing to look at on kadmit's own
// Service. podMirror adds what a cluster has: Deployment kadmit, a
// ReplicaSet per rollout, one running, ready Pod per live replica (named
// after it, so the slice's targetRefs resolve), and a PodDisruptionBudget,
// as the chart installs. A rolling restart then shows the watch two
// ReplicaSets of one Deployment behind the Service, which must not read as
// a selector collision.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// podMirror keeps one Pod object per live replica of the cluster.
type podMirror struct {
	e      *env
	deploy *appsv1.Deployment

	mu      sync.Mutex
	rs      *appsv1.ReplicaSet // new pods' owner
	rsNames []string
	pods    map[string]bool // replica name -> its Pod exists
	err     error           // the first error, reported at cleanup

	stop, done chan struct{}
}

// kadmitLabels are the pod template labels the Service selects.
var kadmitLabels = map[string]string{"app": "kadmit"}

// startPodMirror creates Deployment kadmit, its first ReplicaSet and the PDB,
// and keeps the pods in step with c.live() every 200ms until t ends, when it
// deletes everything it made.
func (e *env) startPodMirror(t *testing.T) *podMirror {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	m := &podMirror{e: e, pods: map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: serviceName, Namespace: systemNS, Labels: kadmitLabels},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3), Selector: &metav1.LabelSelector{MatchLabels: kadmitLabels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: kadmitLabels}, Spec: kadmitPodSpec()}},
	}
	var err error
	if m.deploy, err = e.Client.AppsV1().Deployments(systemNS).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Deployment kadmit: %v", err)
	}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: serviceName, Namespace: systemNS},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: kadmitLabels}},
	}
	if _, err := e.Client.PolicyV1().PodDisruptionBudgets(systemNS).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create PodDisruptionBudget kadmit: %v", err)
	}
	t.Cleanup(func() { m.shutdown(t) })
	if err := m.rollout(ctx, "5b7d8c9f4"); err != nil {
		t.Fatal(err)
	}
	go m.run()
	return m
}

func kadmitPodSpec() corev1.PodSpec {
	return corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To[int64](45), Containers: []corev1.Container{{Name: "kadmit", Image: "kadmit:e2e", Args: []string{"serve"},
		Ports: []corev1.ContainerPort{{Name: portName, ContainerPort: targetPort, Protocol: corev1.ProtocolTCP}},
		// The chart's preStop sleep (deploy/helm/kadmit/templates/deployment.yaml),
		// without which the watch reports KD203.
		Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 10}}}}}}
}

// rollout makes ReplicaSet kadmit-<hash> the owner of the pods created from
// now on, as a Deployment rollout (kubectl rollout restart) does.
func (m *podMirror) rollout(ctx context.Context, hash string) error {
	lbls := map[string]string{"pod-template-hash": hash}
	for k, v := range kadmitLabels {
		lbls[k] = v
	}
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: serviceName + "-" + hash, Namespace: systemNS, Labels: lbls,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(m.deploy, appsv1.SchemeGroupVersion.WithKind("Deployment"))}},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](3), Selector: &metav1.LabelSelector{MatchLabels: lbls},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: lbls}, Spec: kadmitPodSpec()}},
	}
	rs, err := m.e.Client.AppsV1().ReplicaSets(systemNS).Create(ctx, rs, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create ReplicaSet %s-%s: %w", serviceName, hash, err)
	}
	m.mu.Lock()
	m.rs = rs
	m.rsNames = append(m.rsNames, rs.Name)
	m.mu.Unlock()
	return nil
}

func (m *podMirror) run() {
	defer close(m.done)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		m.sync()
		select {
		case <-m.stop:
			return
		case <-tick.C:
		}
	}
}

// sync creates the pods of new live replicas and deletes those of removed
// ones.
func (m *podMirror) sync() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	live := map[string]*replica{}
	for _, r := range m.e.cluster.live() {
		live[r.name] = r
	}
	m.mu.Lock()
	rs := m.rs
	var create []*replica
	var del []string
	for name, r := range live {
		if !m.pods[name] {
			create = append(create, r)
		}
	}
	for name := range m.pods {
		if live[name] == nil {
			del = append(del, name)
		}
	}
	m.mu.Unlock()
	api := m.e.Client.CoreV1().Pods(systemNS)
	for _, r := range create {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: r.name, Namespace: systemNS, Labels: rs.Spec.Template.Labels,
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}},
			Spec: rs.Spec.Template.Spec,
		}
		p, err := api.Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			m.fail(fmt.Errorf("create pod %s: %w", r.name, err))
			continue
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: r.ip, PodIPs: []corev1.PodIP{{IP: r.ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}}
		if _, err := api.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			m.fail(fmt.Errorf("pod %s status: %w", r.name, err))
		}
		m.mu.Lock()
		m.pods[r.name] = true
		m.mu.Unlock()
	}
	for _, name := range del {
		err := api.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		if err != nil && !apierrors.IsNotFound(err) {
			m.fail(fmt.Errorf("delete pod %s: %w", name, err))
			continue
		}
		m.mu.Lock()
		delete(m.pods, name)
		m.mu.Unlock()
	}
}

func (m *podMirror) fail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err == nil {
		m.err = err
	}
}

// synced fails until every live replica has its Pod.
func (m *podMirror) synced() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	for _, r := range m.e.cluster.live() {
		if !m.pods[r.name] {
			return fmt.Errorf("no Pod for %s yet", r.name)
		}
	}
	return nil
}

// shutdown stops the mirror and deletes every object it made.
func (m *podMirror) shutdown(t *testing.T) {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	// run may not have started when set-up failed.
	select {
	case <-m.done:
	case <-time.After(10 * time.Second):
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := m.e.Client
	var errs []error
	add := func(err error) {
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for name := range m.pods {
		add(cs.CoreV1().Pods(systemNS).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
	}
	for _, n := range m.rsNames {
		add(cs.AppsV1().ReplicaSets(systemNS).Delete(ctx, n, metav1.DeleteOptions{}))
	}
	add(cs.AppsV1().Deployments(systemNS).Delete(ctx, serviceName, metav1.DeleteOptions{}))
	add(cs.PolicyV1().PodDisruptionBudgets(systemNS).Delete(ctx, serviceName, metav1.DeleteOptions{}))
	if m.err != nil {
		errs = append(errs, m.err)
	}
	if err := errors.Join(errs...); err != nil {
		t.Errorf("kadmit's Pod objects: %v", err)
	}
}
