// Package registration builds kadmit's MutatingWebhookConfiguration and
// ValidatingWebhookConfiguration from the enabled hooks and applies them.
package registration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/kadmit/kadmit/internal/admission"
)

// FieldManager is the server-side apply field manager kadmit writes with.
const FieldManager = "kadmit"

// DefaultName is the name of both configurations unless an install names
// them (kadmit serve --webhook-config-name; the Helm chart uses the
// release's full name so two releases never share them).
const DefaultName = "kadmit"

// IgnoreLabel on a namespace excludes it from every kadmit webhook.
const IgnoreLabel = "kadmit.io/ignore"

// DefaultTimeoutSeconds is each webhook's timeoutSeconds: short, because the
// API server waits this long on every matched request when kadmit is down.
const DefaultTimeoutSeconds int32 = 5

// mirrorPodCondition skips static (mirror) pods: the kubelet creates them and
// cannot act on a denial or a mutation, so a webhook must never block them.
const mirrorPodCondition = `!has(object.metadata.annotations) || !('kubernetes.io/config.mirror' in object.metadata.annotations)`

// Options describe where the API server reaches kadmit.
type Options struct {
	// Name of both configurations; default DefaultName.
	Name string
	// URL, when set, is the base URL of kadmit (dev mode), e.g.
	// https://127.0.0.1:9443; each webhook calls URL+path.
	URL string
	// ServiceNamespace, ServiceName and ServicePort are used when URL is empty.
	ServiceNamespace string
	ServiceName      string
	ServicePort      int32
	// CABundle is the PEM CA the API server verifies kadmit's certificate with.
	CABundle []byte
	// ExcludeNamespaces are never intercepted, in addition to kube-system and
	// namespaces labelled kadmit.io/ignore=true. kadmit's own namespace belongs
	// here so a restart of its pods can never be blocked by itself.
	ExcludeNamespaces []string
	// TimeoutSeconds per webhook; 0 means DefaultTimeoutSeconds.
	TimeoutSeconds int32
}

// ErrNoEndpoint is returned when Options name neither a URL nor a Service.
var ErrNoEndpoint = errors.New("registration needs a webhook URL or a Service name and namespace")

// Build renders the two configurations for hooks. Either may be nil when no
// hook of its type is enabled. Each webhook is named "<policy>.kadmit.io".
func Build(hooks []admission.Hook, opts Options) (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	if opts.URL == "" && (opts.ServiceName == "" || opts.ServiceNamespace == "") {
		return nil, nil, ErrNoEndpoint
	}
	if opts.Name == "" {
		opts.Name = DefaultName
	}
	if errs := validation.IsDNS1123Subdomain(opts.Name); len(errs) > 0 {
		return nil, nil, fmt.Errorf("webhook configuration name %q: %s", opts.Name, strings.Join(errs, "; "))
	}
	if opts.TimeoutSeconds == 0 {
		opts.TimeoutSeconds = DefaultTimeoutSeconds
	}
	// One webhook per path: a path runs every hook on it, so two webhooks
	// on one path would make the API server call it twice per request.
	webhooks, err := admission.NewWebhooks(hooks)
	if err != nil {
		return nil, nil, err
	}
	var mwc *admissionregistrationv1.MutatingWebhookConfiguration
	var vwc *admissionregistrationv1.ValidatingWebhookConfiguration
	names := map[admission.Type]map[string]bool{admission.Mutating: {}, admission.Validating: {}}
	sideEffects := admissionregistrationv1.SideEffectClassNone
	equivalent := admissionregistrationv1.Equivalent
	for _, wh := range webhooks {
		name, rules, fp := webhookName(wh), []admissionregistrationv1.RuleWithOperations(nil), admissionregistrationv1.Ignore
		for _, h := range wh.Hooks {
			for _, r := range h.Rules {
				// Spell out the API server's default scope ("*"), so the
				// registrar's comparison with the live object (which carries
				// the default) finds nothing to write when nothing changed.
				if r.Scope == nil {
					all := admissionregistrationv1.AllScopes
					r.Scope = &all
				}
				rules = append(rules, r)
			}
			// The strictest failurePolicy on the path wins: a Fail policy must
			// not be skipped because another policy shares its path.
			if h.FailurePolicy != admissionregistrationv1.Ignore {
				fp = admissionregistrationv1.Fail
			}
		}
		if names[wh.Type][name] {
			// The same policy on a second path of the same type.
			name = strings.TrimSuffix(name, ".kadmit.io") + "-" + strings.ReplaceAll(strings.Trim(wh.Path, "/"), "/", "-") + ".kadmit.io"
		}
		names[wh.Type][name] = true
		cc := clientConfig(opts, wh.Path)
		nsSel := namespaceSelector(opts.ExcludeNamespaces)
		if only := onlyNamespaces(wh); len(only) > 0 {
			nsSel = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: only},
			}}
		}
		var conds []admissionregistrationv1.MatchCondition
		if touchesPods(rules) {
			conds = []admissionregistrationv1.MatchCondition{{Name: "skip-mirror-pods", Expression: mirrorPodCondition}}
		}
		timeout := opts.TimeoutSeconds
		switch wh.Type {
		case admission.Mutating:
			reinvoke := reinvocationPolicy(wh)
			if mwc == nil {
				mwc = &admissionregistrationv1.MutatingWebhookConfiguration{
					TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingWebhookConfiguration"},
					ObjectMeta: objectMeta(opts.Name),
				}
			}
			mwc.Webhooks = append(mwc.Webhooks, admissionregistrationv1.MutatingWebhook{
				Name: name, ClientConfig: cc, Rules: rules, FailurePolicy: &fp, MatchPolicy: &equivalent,
				NamespaceSelector: nsSel, ObjectSelector: &metav1.LabelSelector{}, SideEffects: &sideEffects,
				TimeoutSeconds: &timeout, AdmissionReviewVersions: []string{"v1", "v1beta1"},
				ReinvocationPolicy: &reinvoke, MatchConditions: conds,
			})
		case admission.Validating:
			if vwc == nil {
				vwc = &admissionregistrationv1.ValidatingWebhookConfiguration{
					TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
					ObjectMeta: objectMeta(opts.Name),
				}
			}
			vwc.Webhooks = append(vwc.Webhooks, admissionregistrationv1.ValidatingWebhook{
				Name: name, ClientConfig: cc, Rules: rules, FailurePolicy: &fp, MatchPolicy: &equivalent,
				NamespaceSelector: nsSel, ObjectSelector: &metav1.LabelSelector{}, SideEffects: &sideEffects,
				TimeoutSeconds: &timeout, AdmissionReviewVersions: []string{"v1", "v1beta1"},
				MatchConditions: conds,
			})
		}
	}
	return mwc, vwc, nil
}

// Apply writes the configurations with server-side apply (field manager
// kadmit, forced: kadmit owns these objects). Nil configurations are skipped.
func Apply(ctx context.Context, cs kubernetes.Interface, mwc *admissionregistrationv1.MutatingWebhookConfiguration, vwc *admissionregistrationv1.ValidatingWebhookConfiguration) error {
	force := true
	po := metav1.PatchOptions{FieldManager: FieldManager, Force: &force}
	if mwc != nil {
		data, err := json.Marshal(mwc)
		if err != nil {
			return fmt.Errorf("encode MutatingWebhookConfiguration %s: %w", mwc.Name, err)
		}
		if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Patch(ctx, mwc.Name, types.ApplyPatchType, data, po); err != nil {
			return fmt.Errorf("apply MutatingWebhookConfiguration %s: %w", mwc.Name, err)
		}
	}
	if vwc != nil {
		data, err := json.Marshal(vwc)
		if err != nil {
			return fmt.Errorf("encode ValidatingWebhookConfiguration %s: %w", vwc.Name, err)
		}
		if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Patch(ctx, vwc.Name, types.ApplyPatchType, data, po); err != nil {
			return fmt.Errorf("apply ValidatingWebhookConfiguration %s: %w", vwc.Name, err)
		}
	}
	return nil
}

// reinvocationPolicy is the path's reinvocationPolicy: IfNeeded when any
// of its hooks asks for it or leaves it unset (see
// admission.Hook.ReinvocationPolicy), Never only when every hook says
// Never. One webhook serves the whole path, so a hook that wants to see
// later mutators' changes must not lose that because another hook on the
// path does not; the price is that a Never hook on a shared path runs
// again when the API server reinvokes the webhook.
func reinvocationPolicy(wh *admission.Webhook) admissionregistrationv1.ReinvocationPolicyType {
	for _, h := range wh.Hooks {
		if h.ReinvocationPolicy == nil || *h.ReinvocationPolicy != admissionregistrationv1.NeverReinvocationPolicy {
			return admissionregistrationv1.IfNeededReinvocationPolicy
		}
	}
	return admissionregistrationv1.NeverReinvocationPolicy
}

// webhookName is "<policy>.kadmit.io" when one policy serves the path, else
// the path's name, e.g. "validate-pod.kadmit.io".
func webhookName(wh *admission.Webhook) string {
	policy := wh.Hooks[0].Policy
	for _, h := range wh.Hooks[1:] {
		if h.Policy != policy {
			return strings.ReplaceAll(strings.Trim(wh.Path, "/"), "/", "-") + ".kadmit.io"
		}
	}
	return policy + ".kadmit.io"
}

func objectMeta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/managed-by": "kadmit"}}
}

func clientConfig(opts Options, path string) admissionregistrationv1.WebhookClientConfig {
	cc := admissionregistrationv1.WebhookClientConfig{CABundle: opts.CABundle}
	if opts.URL != "" {
		u := strings.TrimRight(opts.URL, "/") + path
		cc.URL = &u
		return cc
	}
	port := opts.ServicePort
	if port == 0 {
		port = 443
	}
	p := path
	cc.Service = &admissionregistrationv1.ServiceReference{Namespace: opts.ServiceNamespace, Name: opts.ServiceName, Path: &p, Port: &port}
	return cc
}

func namespaceSelector(exclude []string) *metav1.LabelSelector {
	names := append([]string{"kube-system"}, exclude...)
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: dedupe(names)},
		{Key: IgnoreLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"true"}},
	}}
}

// onlyNamespaces is the union of the hooks' Namespaces when every hook on the
// path sets them; one hook without them needs the default selector.
func onlyNamespaces(wh *admission.Webhook) []string {
	var out []string
	for _, h := range wh.Hooks {
		if len(h.Namespaces) == 0 {
			return nil
		}
		out = append(out, h.Namespaces...)
	}
	return dedupe(out)
}

// touchesPods reports whether the rules select requests for pod objects
// (the main resource, any operation), asked of the one rule matcher so that
// "pods", "*", "*/*", "pods/*" and group or version wildcards all count.
func touchesPods(rules []admissionregistrationv1.RuleWithOperations) bool {
	pods := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update, admissionv1.Delete, admissionv1.Connect} {
		if admission.MatchRules(rules, admission.NewRuleAttributes(pods, "", op, "any")) {
			return true
		}
	}
	return false
}

func dedupe(in []string) []string {
	seen := map[string]bool{}
	out := in[:0:0]
	for _, s := range in {
		if s != "" && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
