package config

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// DefaultConfigMapKey is the ConfigMap data key holding the configuration.
const DefaultConfigMapKey = "config.yaml"

// LoadConfigMap reads data[key] of the ConfigMap namespace/name from the API
// server and parses it with FromConfigMap.
func (l Loader) LoadConfigMap(ctx context.Context, cs kubernetes.Interface, namespace, name, key string) (*Configuration, error) {
	cm, err := cs.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read ConfigMap %s/%s: %w", namespace, name, err)
	}
	return l.FromConfigMap(cm, key)
}

// WatchConfigMap follows the ConfigMap namespace/name through an informer
// until ctx ends. Each time data[key] changes, it calls onChange with the
// parsed configuration, or onInvalid with the error FromConfigMap returns
// (the caller keeps what it runs: a bad edit never takes policies away). A
// deleted ConfigMap is reported to onInvalid too. Callbacks run one at a
// time. It returns an error when the informer does not sync within a minute.
func (l Loader) WatchConfigMap(ctx context.Context, cs kubernetes.Interface, namespace, name, key string, onChange func(*Configuration), onInvalid func(error)) error {
	f := informers.NewSharedInformerFactoryWithOptions(cs, 10*time.Minute,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	inf := f.Core().V1().ConfigMaps().Informer()
	var mu sync.Mutex
	var last string
	seen := false
	handle := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		data, present := cm.Data[key]
		if seen && present && data == last {
			return
		}
		seen, last = true, data
		c, err := l.FromConfigMap(cm, key)
		if err != nil {
			onInvalid(err)
			return
		}
		onChange(c)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    handle,
		UpdateFunc: func(_, obj any) { handle(obj) },
		DeleteFunc: func(any) {
			mu.Lock()
			defer mu.Unlock()
			seen = false
			onInvalid(fmt.Errorf("ConfigMap %s/%s was deleted; keeping the running configuration", namespace, name))
		},
	}); err != nil {
		return fmt.Errorf("watch ConfigMap %s/%s: %w", namespace, name, err)
	}
	f.Start(ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
		return fmt.Errorf("watch ConfigMap %s/%s: informer did not sync", namespace, name)
	}
	return nil
}
