// Package uninstall removes kadmit's webhook configurations so that no
// webhook outlives its server. It is `kadmit uninstall`, which the Helm
// chart runs as a pre-delete hook.
//
// Deleting the configurations alone is not enough while kadmit runs: the
// elected replica watches them and writes them straight back. So the order
// is: scale kadmit's Deployment to zero, wait until none of its pods is left,
// then delete the MutatingWebhookConfiguration and the
// ValidatingWebhookConfiguration, and check that they are gone.
package uninstall

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// DefaultConfigurationName is the name kadmit registers both
// configurations under.
const DefaultConfigurationName = "kadmit"

// Options configure Run.
type Options struct {
	Client    kubernetes.Interface
	Namespace string
	// Deployment is kadmit's Deployment in Namespace; empty skips scaling
	// (kadmit already stopped, or not run by a Deployment).
	Deployment string
	// PodSelector (a label selector) finds kadmit's pods when Deployment is
	// empty or already deleted; with a live Deployment its own selector is
	// used. Empty with no Deployment: nothing to wait for.
	PodSelector string
	// ConfigurationName of both webhook configurations; default "kadmit".
	ConfigurationName string
	// Poll paces the waits; default 1s.
	Poll   time.Duration
	Logger *slog.Logger
}

// Result says what Run did.
type Result struct {
	// ScaledDown is true when the Deployment was scaled from non-zero to 0.
	ScaledDown bool
	// Deleted names the configurations deleted ("MutatingWebhookConfiguration/kadmit", ...).
	Deleted []string
}

// Run stops kadmit and deletes its webhook configurations. ctx bounds the
// whole run; on ctx's end it returns an error saying what it waited for.
func Run(ctx context.Context, o Options) (Result, error) {
	var res Result
	if o.Client == nil || o.Namespace == "" {
		return res, errors.New("uninstall: client and namespace are required")
	}
	if o.ConfigurationName == "" {
		o.ConfigurationName = DefaultConfigurationName
	}
	if o.Poll <= 0 {
		o.Poll = time.Second
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}

	selector, err := labels.Parse(o.PodSelector)
	if err != nil {
		return res, fmt.Errorf("uninstall: --pod-selector %q: %w", o.PodSelector, err)
	}
	if o.Deployment != "" {
		sel, scaled, err := scaleToZero(ctx, o, log)
		if err != nil {
			return res, err
		}
		res.ScaledDown = scaled
		if sel != nil {
			selector = sel
		}
	}
	if !selector.Empty() {
		if err := waitNoPods(ctx, o, selector, log); err != nil {
			return res, err
		}
	}

	ar := o.Client.AdmissionregistrationV1()
	deletes := []struct {
		kind string
		del  func(context.Context, string, metav1.DeleteOptions) error
		get  func() error
	}{
		{"MutatingWebhookConfiguration", ar.MutatingWebhookConfigurations().Delete, func() error {
			_, err := ar.MutatingWebhookConfigurations().Get(ctx, o.ConfigurationName, metav1.GetOptions{})
			return err
		}},
		{"ValidatingWebhookConfiguration", ar.ValidatingWebhookConfigurations().Delete, func() error {
			_, err := ar.ValidatingWebhookConfigurations().Get(ctx, o.ConfigurationName, metav1.GetOptions{})
			return err
		}},
	}
	for _, d := range deletes {
		err := d.del(ctx, o.ConfigurationName, metav1.DeleteOptions{})
		switch {
		case err == nil:
			res.Deleted = append(res.Deleted, d.kind+"/"+o.ConfigurationName)
			log.Info("deleted webhook configuration", "kind", d.kind, "name", o.ConfigurationName)
		case apierrors.IsNotFound(err):
			log.Info("webhook configuration already absent", "kind", d.kind, "name", o.ConfigurationName)
		default:
			return res, fmt.Errorf("uninstall: delete %s %s: %w", d.kind, o.ConfigurationName, err)
		}
	}
	// A configuration re-created between the pod check and the delete (a
	// kadmit started by hand, another release) shows up here, not later as
	// a webhook without a server.
	for _, d := range deletes {
		if err := d.get(); !apierrors.IsNotFound(err) {
			if err == nil {
				return res, fmt.Errorf("uninstall: %s %s exists again after deletion: another kadmit is writing it", d.kind, o.ConfigurationName)
			}
			return res, fmt.Errorf("uninstall: check %s %s: %w", d.kind, o.ConfigurationName, err)
		}
	}
	return res, nil
}

// scaleToZero sets the Deployment's scale to 0 and returns its pod
// selector. A missing Deployment is not an error: it returns a nil selector.
func scaleToZero(ctx context.Context, o Options, log *slog.Logger) (labels.Selector, bool, error) {
	deps := o.Client.AppsV1().Deployments(o.Namespace)
	d, err := deps.Get(ctx, o.Deployment, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		log.Info("Deployment not found; not scaling", "namespace", o.Namespace, "deployment", o.Deployment)
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("uninstall: get Deployment %s/%s: %w", o.Namespace, o.Deployment, err)
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return nil, false, fmt.Errorf("uninstall: Deployment %s/%s selector: %w", o.Namespace, o.Deployment, err)
	}
	if d.Spec.Replicas != nil && *d.Spec.Replicas == 0 {
		return sel, false, nil
	}
	// The scale subresource: the only write the hook's Role allows on it.
	patch := []byte(`{"spec":{"replicas":0}}`)
	if _, err := deps.Patch(ctx, o.Deployment, types.MergePatchType, patch, metav1.PatchOptions{}, "scale"); err != nil {
		return nil, false, fmt.Errorf("uninstall: scale Deployment %s/%s to 0: %w", o.Namespace, o.Deployment, err)
	}
	log.Info("scaled Deployment to 0", "namespace", o.Namespace, "deployment", o.Deployment)
	return sel, true, nil
}

// waitNoPods polls until no pod matching selector is left in the namespace,
// terminating ones included: a terminating kadmit still runs (preStop,
// draining) and its leader still writes the configurations.
func waitNoPods(ctx context.Context, o Options, selector labels.Selector, log *slog.Logger) error {
	pods := o.Client.CoreV1().Pods(o.Namespace)
	lastLogged := time.Time{}
	for {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: selector.String()})
		if err != nil {
			return fmt.Errorf("uninstall: list pods %s in %s: %w", selector, o.Namespace, err)
		}
		var left []string
		for _, p := range list.Items {
			// Finished pods run no kadmit process.
			if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue
			}
			left = append(left, p.Name)
		}
		if len(left) == 0 {
			return nil
		}
		if time.Since(lastLogged) > 10*time.Second {
			log.Info("waiting for kadmit's pods to end", "namespace", o.Namespace, "pods", left)
			lastLogged = time.Now()
		}
		t := time.NewTimer(o.Poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("uninstall: pods %v (selector %s) still running: %w", left, selector, ctx.Err())
		case <-t.C:
		}
	}
}
