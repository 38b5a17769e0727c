package clustercache

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kadmit/kadmit/internal/testkit"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

func obj(i int, raw string) StaticObject {
	return StaticObject{Source: "state.yaml", Index: i, Raw: []byte(raw)}
}

func TestNewStatic(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	objs := []StaticObject{
		obj(0, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"a","managedFields":[{"manager":"x"}]},"spec":{"containers":[{"name":"c","image":"i","resources":{"requests":{"cpu":"2"}}}]}}`),
		obj(1, `{"apiVersion":"kueue.x-k8s.io/v1beta1","kind":"LocalQueue","metadata":{"name":"default","namespace":"a"},"spec":{"clusterQueue":"cq"}}`),
		obj(2, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"ignored","namespace":"a"}}`),
		obj(3, `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a","labels":{"team":"x"}}}`),
	}
	c, err := NewStatic(ctx, wholes(Pods, LocalQueues, Namespaces, ElasticQuotas, Pods), objs)
	if err != nil {
		t.Fatal(err)
	}
	pods, ok := c.Informer(Pods)
	if !ok {
		t.Fatal("no pod informer")
	}
	got, exists, err := pods.GetStore().GetByKey("a/p")
	if err != nil || !exists {
		t.Fatalf("pod a/p: exists %v err %v", exists, err)
	}
	pod, typed := got.(*corev1.Pod)
	if !typed || pod.Spec.Containers[0].Resources.Requests.Cpu().String() != "2" || pod.ManagedFields != nil {
		t.Fatalf("pod %#v", got)
	}
	if byNS, err := pods.GetIndexer().ByIndex(cache.NamespaceIndex, "a"); err != nil || len(byNS) != 1 {
		t.Fatalf("namespace index: %v %v", byNS, err)
	}
	lq, _ := c.Informer(LocalQueues)
	if got, exists, _ := lq.GetStore().GetByKey("a/default"); !exists {
		t.Fatal("LocalQueue a/default missing")
	} else if _, ok := got.(*unstructured.Unstructured); !ok {
		t.Fatalf("LocalQueue cached as %T", got)
	}
	ns, _ := c.Informer(Namespaces)
	if got, exists, _ := ns.GetStore().GetByKey("a"); !exists || got.(*corev1.Namespace).Labels["team"] != "x" || got.(*corev1.Namespace).Labels[corev1.LabelMetadataName] != "a" {
		t.Fatalf("namespace a: %v", got)
	}
	// A custom resource with no objects is served and empty.
	if eq, ok := c.Informer(ElasticQuotas); !ok || len(eq.GetStore().List()) != 0 {
		t.Fatalf("elastic quotas: %v", ok)
	}
	// An event handler added after sync sees the listed objects, as with
	// a live informer.
	added := make(chan string, 4)
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(o any) { added <- o.(*corev1.Pod).Name }}); err != nil {
		t.Fatal(err)
	}
	if name := <-added; name != "p" {
		t.Fatalf("handler saw %q", name)
	}
	// A built-in resource with an empty state still gets its typed informer.
	c2, err := NewStatic(ctx, wholes(Namespaces, Resource{GroupVersionResource: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if inf, ok := c2.Informer(Namespaces); !ok || len(inf.GetStore().List()) != 0 {
		t.Fatal("empty namespaces informer")
	}
}

func TestNewStaticErrors(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	big := []byte(`{"x":"` + strings.Repeat("a", 1<<20) + `"}`)
	tooBig := make([]StaticObject, MaxStaticBytes/len(big)+1)
	for i := range tooBig {
		tooBig[i] = StaticObject{Source: "big.yaml", Index: i, Raw: big}
	}
	many := make([]StaticObject, MaxStaticObjects+1)
	for _, tc := range []struct {
		name string
		objs []StaticObject
		want string
	}{
		{"not JSON object", []StaticObject{obj(0, `[1]`)}, "state.yaml (document 0)"},
		{"no kind", []StaticObject{obj(0, `{"apiVersion":"v1","metadata":{"name":"x"}}`)}, "state.yaml (document 0): Object 'Kind' is missing"},
		{"no apiVersion", []StaticObject{obj(0, `{"kind":"Pod","apiVersion":""}`)}, "state.yaml (document 0)"},
		{"bad pod", []StaticObject{obj(0, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":"nope"}}`)}, `state.yaml (document 0): Pod "p": `},
		{"duplicate", []StaticObject{
			obj(0, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"a"}}`),
			obj(4, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"a"}}`)}, `state.yaml (document 4): Pod "p" in namespace "a" is also in state.yaml (document 0)`},
		{"too many objects", many, fmt.Sprintf("%d objects, more than %d", len(many), MaxStaticObjects)},
		{"too many bytes", tooBig, fmt.Sprintf("big.yaml (document %d): more than %d bytes", len(tooBig)-1, MaxStaticBytes)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewStatic(ctx, wholes(Pods, LocalQueues), tc.objs)
			if !errors.Is(err, ErrStatic) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrStatic containing %q", err, tc.want)
			}
		})
	}
}

// TestNewStaticStopsWithContext: the informers' goroutines end with ctx.
func TestNewStaticStopsWithContext(t *testing.T) {
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := NewStatic(ctx, wholes(Pods, Namespaces, LocalQueues, ElasticQuotas), nil); err != nil {
		t.Fatal(err)
	}
	cancel()
	testkit.EventuallyNil(t, 10*time.Second, "goroutines ended after cancel", func() error {
		if n := runtime.NumGoroutine(); n > before {
			return fmt.Errorf("%d goroutines after cancel, %d before", n, before)
		}
		return nil
	})
}

// BenchmarkNewStatic: building the caches of `kadmit review --state` from
// 10,000 pods.
func BenchmarkNewStatic(b *testing.B) {
	objs := make([]StaticObject, 10_000)
	for i := range objs {
		objs[i] = obj(i, fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p%d","namespace":"ns%d","labels":{"quota.scheduling.koordinator.sh/name":"q"}},"spec":{"containers":[{"name":"c","image":"i","resources":{"requests":{"cpu":"100m","memory":"64Mi"}}}]},"status":{"phase":"Running"}}`, i, i%50))
	}
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		if _, err := NewStatic(ctx, wholes(Pods), objs); err != nil {
			b.Fatal(err)
		}
		cancel()
	}
}

// wholes reads rs's whole objects.
func wholes(rs ...Resource) []Read {
	out := make([]Read, len(rs))
	for i, r := range rs {
		out[i] = r.Whole()
	}
	return out
}
