package sloconfig

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// informerNodesFor is the production Nodes over a store of n nodes.
func informerNodesFor(t *testing.T, n int) Nodes {
	t.Helper()
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	for i := 0; i < n; i++ {
		if err := store.Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%04d", i), Labels: map[string]string{fmt.Sprint(i % 3): fmt.Sprint(i % 3)}}}); err != nil {
			t.Fatal(err)
		}
	}
	return informerNodes{store}
}

// TestInformerAdapters: the store adapters Definition.Build wires list
// nodes in name order and read the configured ConfigMap.
func TestInformerAdapters(t *testing.T) {
	nodes := informerNodesFor(t, 5)
	var names []string
	if err := nodes.NodeLabels(context.Background(), func(name string, _ map[string]string) error {
		names = append(names, name)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(names) != "[n0000 n0001 n0002 n0003 n0004]" {
		t.Fatalf("%v", names)
	}
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	_ = store.Add(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: DefaultName}, Data: map[string]string{"k": "v"}})
	cms := informerConfigMaps{store}
	if d, ok := cms.Data(DefaultNamespace, DefaultName); !ok || d["k"] != "v" {
		t.Fatalf("%v %v", d, ok)
	}
	if _, ok := cms.Data(DefaultNamespace, "other"); ok {
		t.Fatal("found a missing ConfigMap")
	}
	// With "1":"1" and "2":"2" strategies, the nodes conflict with neither.
	p := newPolicy(t, DefaultConfig(), informerNodesFor(t, 300))
	r := cmReq("CREATE", colocation(`{"name":"1","nodeSelector":{"matchLabels":{"1":"1"}}}`, `{"name":"2","nodeSelector":{"matchLabels":{"2":"2"}}}`), nil)
	if v := p.ValidateConfigMap(context.Background(), r); !v.Allowed {
		t.Fatalf("%+v", v)
	}
}
