package koordnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/test/poll"
)

// denied fails t unless err is the API server's answer to a webhook
// denial with code and a message containing want.
func denied(t *testing.T, err error, code int32, want string) {
	t.Helper()
	var se *apierrors.StatusError
	if !errors.As(err, &se) || se.ErrStatus.Code != code || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want a %d denial containing %q", err, code, want)
	}
}

// TestSLOControllerConfig: the slo-controller-config in the configured
// namespace is validated on CREATE and UPDATE as koord-manager v1.8.0
// does, DELETE is allowed, and other ConfigMaps (including kadmit's own,
// judged by kadmit-config on the same path) are not slo-config's business.
func TestSLOControllerConfig(t *testing.T) {
	e := world(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cms := e.Client.CoreV1().ConfigMaps(e.koord)

	_, err := cms.Create(ctx, sloConfigMap(e.koord, map[string]string{
		"resource-threshold-config": `{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":101}}`,
	}), metav1.CreateOptions{})
	denied(t, err, 400, `"ResourceThresholdCfg.ClusterStrategy.CPUSuppressThresholdPercent":"CPUSuppressThresholdPercent must be 100 or less"`)

	good := sloConfigMap(e.koord, map[string]string{
		"colocation-config":         `{"enable":true,"cpuReclaimThresholdPercent":60}`,
		"resource-threshold-config": `{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":65}}`,
		"cpu-burst-config":          `{"clusterStrategy":{"policy":"auto","cpuBurstPercent":1000,"cfsQuotaBurstPercent":300}}`,
		"system-config":             `{"clusterStrategy":{"minFreeKbytesFactor":100,"totalNetworkBandwidth":"1000M"}}`,
		"resource-qos-config":       `{"clusterStrategy":{"lsrClass":{"cpuQOS":{"enable":true,"groupIdentity":2},"networkQOS":{"ingressRequest":20}}}}`,
	})
	created, err := cms.Create(ctx, good, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("valid slo-controller-config: %v", err)
	}

	overlap := created.DeepCopy()
	overlap.Data["colocation-config"] = `{"enable":true,"nodeConfigs":[` +
		`{"name":"a","nodeSelector":{"matchLabels":{"pool":"a"}}},` +
		`{"name":"b","nodeSelector":{"matchExpressions":[{"key":"pool","operator":"Exists"}]}}]}`
	_, err = cms.Update(ctx, overlap, metav1.UpdateOptions{})
	denied(t, err, 400, `___{"reason":"NodeStrategiesOverlap","message":{"config":"colocation-config","strategies":["a","b"]}}___`)

	bad := created.DeepCopy()
	bad.Data["resource-qos-config"] = `{"clusterStrategy":{"lsrClass":{"networkQOS":{"ingressRequest":60}},"beClass":{"networkQOS":{"ingressRequest":50}}}}`
	_, err = cms.Update(ctx, bad, metav1.UpdateOptions{})
	denied(t, err, 400, "ClusterStrategy total net bandwidth percentage already over 100")

	// The same ConfigMap elsewhere is not the configured one.
	other := sloConfigMap(e.config, map[string]string{"colocation-config": `{"metricAggregateDurationSeconds":0}`})
	if _, err := e.Client.CoreV1().ConfigMaps(e.config).Create(ctx, other, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("slo-controller-config outside %s: %v", e.koord, err)
	}
	// kadmit-config still judges kadmit's own ConfigMap on the shared path.
	kc := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: e.config, Name: "kadmit"},
		Data: map[string]string{"config.yaml": "apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  lifespan: {max: -1}\n"}}
	_, err = e.Client.CoreV1().ConfigMaps(e.config).Create(ctx, kc, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	denied(t, err, 403, "policies.lifespan.max")

	if err := cms.Delete(ctx, "slo-controller-config", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete: %v", err)
	}
}

// TestNodeConflicts: node strategies of one key that both match an existing
// node are refused in the ConfigMap (kadmit's node informer), and a node
// label change that makes a node match two stored strategies is refused on
// /validate-node (kadmit's ConfigMap informer).
func TestNodeConflicts(t *testing.T) {
	e := world(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nodes := e.Client.CoreV1().Nodes()
	name := "koord-conflict-" + e.suffix
	if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"gpu-" + e.suffix: "true", "ssd-" + e.suffix: "true"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodes.Delete(context.Background(), name, metav1.DeleteOptions{}) })

	strategies := fmt.Sprintf(`{"nodeStrategies":[`+
		`{"name":"gpu","nodeSelector":{"matchLabels":{"gpu-%[1]s":"true"}},"cpuSuppressThresholdPercent":60},`+
		`{"name":"ssd","nodeSelector":{"matchLabels":{"ssd-%[1]s":"true"}},"cpuSuppressThresholdPercent":70}]}`, e.suffix)
	cm := sloConfigMap(e.koord, map[string]string{"resource-threshold-config": strategies})
	want := fmt.Sprintf(`___{"reason":"ExistNodeConfict","message":{"config":"resource-threshold-config","strategies":["gpu","ssd"],"exampleNodes":[%q]}}___`, name)
	// kadmit's node informer sees the node within cacheWait.
	if err := poll.Until(ctx, cacheWait, func(ctx context.Context) error {
		_, err := e.Client.CoreV1().ConfigMaps(e.koord).Create(ctx, cm, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil || !strings.Contains(err.Error(), want) {
			return fmt.Errorf("got %v, want %s", err, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Without the ssd label the strategies do not conflict: store them.
	node, err := nodes.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(node.Labels, "ssd-"+e.suffix)
	if node, err = nodes.Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.CoreV1().ConfigMaps(e.koord).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		// The informer may still hold the old labels.
		if err = poll.Until(ctx, cacheWait, func(ctx context.Context) error {
			_, err := e.Client.CoreV1().ConfigMaps(e.koord).Create(ctx, cm, metav1.CreateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = e.Client.CoreV1().ConfigMaps(e.koord).Delete(context.Background(), "slo-controller-config", metav1.DeleteOptions{})
	})

	// Adding the label back is refused once kadmit's ConfigMap informer
	// holds the stored config.
	if err := poll.Until(ctx, cacheWait, func(ctx context.Context) error {
		n, err := nodes.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Labels["ssd-"+e.suffix] = "true"
		_, err = nodes.Update(ctx, n, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil || !strings.Contains(err.Error(), want) {
			return fmt.Errorf("got %v, want %s", err, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Other label changes pass.
	node.Labels["zone"] = "a"
	if _, err := nodes.Update(ctx, node, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("unrelated label change: %v", err)
	}
}

// TestResourceAmplification: a kubelet-style status write on a node with
// node.koordinator.sh/resource-amplification-ratio amplifies memory and
// records the raw value; cpu, amplified by node-overcommit on the same
// path, is amplified once only; removing the ratio removes the raw
// annotation on the next status write.
func TestResourceAmplification(t *testing.T) {
	e := world(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nodes := e.Client.CoreV1().Nodes()
	name := "koord-amplified-" + e.suffix
	raw := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"node.koordinator.sh/resource-amplification-ratio": `{"cpu":1.5,"memory":2}`}},
		Status:     corev1.NodeStatus{Capacity: raw, Allocatable: raw},
	}
	node, err := nodes.Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodes.Delete(context.Background(), name, metav1.DeleteOptions{}) })

	// The kubelet posts its raw values.
	node.Status.Allocatable, node.Status.Capacity = raw.DeepCopy(), raw.DeepCopy()
	node, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	check := func(cpu, mem string) {
		t.Helper()
		if q := node.Status.Allocatable[corev1.ResourceCPU]; q.Cmp(resource.MustParse(cpu)) != 0 {
			t.Fatalf("allocatable cpu %s, want %s", q.String(), cpu)
		}
		if q := node.Status.Allocatable[corev1.ResourceMemory]; q.Cmp(resource.MustParse(mem)) != 0 {
			t.Fatalf("allocatable memory %s, want %s", q.String(), mem)
		}
		if q := node.Status.Allocatable[corev1.ResourcePods]; q.Cmp(resource.MustParse("110")) != 0 {
			t.Fatalf("allocatable pods %s changed", q.String())
		}
	}
	check("8", "16Gi") // cpu ×2 by node-overcommit only, memory ×2 by the ratio
	var rawAnn corev1.ResourceList
	if err := json.Unmarshal([]byte(node.Annotations["node.koordinator.sh/raw-allocatable"]), &rawAnn); err != nil {
		t.Fatalf("raw-allocatable %q: %v", node.Annotations["node.koordinator.sh/raw-allocatable"], err)
	}
	if len(rawAnn) != 1 || rawAnn.Memory().Cmp(resource.MustParse("8Gi")) != 0 {
		t.Fatalf("raw-allocatable %v, want memory 8Gi only", rawAnn)
	}

	// A status write that carries the amplified values is stable.
	if node, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	check("8", "16Gi")

	// Turning the ratio off: the next kubelet post keeps its raw memory and
	// the raw-allocatable annotation goes.
	delete(node.Annotations, "node.koordinator.sh/resource-amplification-ratio")
	if node, err = nodes.Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	node.Status.Allocatable, node.Status.Capacity = raw.DeepCopy(), raw.DeepCopy()
	if node, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	check("8", "8Gi")
	if v, ok := node.Annotations["node.koordinator.sh/raw-allocatable"]; ok {
		t.Fatalf("raw-allocatable %q left after the ratio was removed", v)
	}

	// An unreadable ratio is refused with 500, as upstream's mutating
	// handler answers (Errored), whatever the failurePolicy.
	node.Annotations["node.koordinator.sh/resource-amplification-ratio"] = `{"cpu":"two"}`
	if node, err = nodes.Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
	denied(t, err, 500, "failed to unmarshal node resource amplification ratio")
}
