package celpolicy_test

import "k8s.io/apimachinery/pkg/runtime/schema"

var schemaPod = struct {
	Kind     schema.GroupVersionKind
	Resource schema.GroupVersionResource
}{schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, schema.GroupVersionResource{Version: "v1", Resource: "pods"}}
