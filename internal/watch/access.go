package watch

import (
	"context"
	"fmt"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// informerResources are what the informers list and watch, cluster-wide.
var informerResources = []struct{ group, resource string }{
	{"admissionregistration.k8s.io", "mutatingwebhookconfigurations"},
	{"admissionregistration.k8s.io", "validatingwebhookconfigurations"},
	{"", "namespaces"},
	{"", "services"},
	{"discovery.k8s.io", "endpointslices"},
	{"", "pods"},
	{"apps", "replicasets"},
	{"apps", "deployments"},
	{"apps", "statefulsets"},
	{"apps", "daemonsets"},
	{"policy", "poddisruptionbudgets"},
	{"networking.k8s.io", "networkpolicies"},
}

// unreadableResources asks the API server (SelfSubjectAccessReview) which
// informer resources this replica may not list and watch cluster-wide. An
// informer on a refused resource would never sync; instead it is not run,
// and every check that needed it says so (a KD001 info finding through
// doctor's Backend.MarkUnreadable), as doctor does with partial access.
// A review the API server cannot answer counts as allowed: the informer
// then reports its own errors.
//
// Errors: the webhook configurations themselves may not be read: without
// them there is nothing to watch.
func unreadableResources(ctx context.Context, cs kubernetes.Interface) (map[string]bool, error) {
	out := map[string]bool{}
	for _, r := range informerResources {
		for _, verb := range []string{"list", "watch"} {
			rev, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Group: r.group, Resource: r.resource}}}, metav1.CreateOptions{})
			if err != nil || rev.Status.Allowed {
				continue
			}
			out[r.resource] = true
		}
	}
	for _, r := range []string{"mutatingwebhookconfigurations", "validatingwebhookconfigurations"} {
		if out[r] {
			return nil, fmt.Errorf("may not list and watch %s.admissionregistration.k8s.io cluster-wide: kadmit watch has nothing to watch without them", r)
		}
	}
	return out, nil
}
