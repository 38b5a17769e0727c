package celpolicy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// ConfigMapDocuments returns the documents a ConfigMap holds for LoadAll:
// one per data key, in lexical key order, named
// "ConfigMap NAMESPACE/NAME data[KEY]". Every key is read whatever its
// name; binaryData is not read. The API server bounds a ConfigMap to
// 1 MiB; LoadAll still bounds each key and the number of objects.
func ConfigMapDocuments(cm *corev1.ConfigMap) []Document {
	out := make([]Document, 0, len(cm.Data))
	for _, k := range slices.Sorted(maps.Keys(cm.Data)) {
		out = append(out, Document{Name: fmt.Sprintf("ConfigMap %s/%s data[%s]", cm.Namespace, cm.Name, k), Data: cm.Data[k]})
	}
	return out
}

// WatchConfigMap follows the ConfigMap namespace/name through an informer
// limited to it (namespaced, field selector metadata.name, so RBAC may
// grant get, list and watch on that resourceName only) until ctx ends.
// It calls changed with the ConfigMap on every add and update, and with
// nil when it is deleted; calls come one at a time (the informer's one
// handler goroutine), and the caller decides what a change means (it is
// not compared here). It returns once the informer has synced, or an
// error when it does not sync within a minute.
func WatchConfigMap(ctx context.Context, cs kubernetes.Interface, namespace, name string, changed func(*corev1.ConfigMap)) error {
	f := informers.NewSharedInformerFactoryWithOptions(cs, 10*time.Minute,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	inf := f.Core().V1().ConfigMaps().Informer()
	handle := func(obj any) {
		// The field selector already limits the watch; a client that
		// ignores it (a test's fake) must not feed another ConfigMap in.
		if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Namespace == namespace && cm.Name == name {
			changed(cm)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    handle,
		UpdateFunc: func(_, obj any) { handle(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Namespace == namespace && cm.Name == name {
				changed(nil)
			}
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
