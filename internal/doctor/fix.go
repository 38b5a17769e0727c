package doctor

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// labelChange is one edit of a namespace's labels: set Key=Value, or remove
// Key when Remove.
type labelChange struct {
	Key, Value string
	Remove     bool
}

func (c labelChange) apply(in map[string]string) map[string]string {
	out := maps.Clone(in)
	if out == nil {
		out = map[string]string{}
	}
	if c.Remove {
		delete(out, c.Key)
	} else {
		out[c.Key] = c.Value
	}
	return out
}

func (c labelChange) kubectl(ns string) string {
	if c.Remove {
		return fmt.Sprintf("kubectl label namespace %s %s-", ns, c.Key)
	}
	return fmt.Sprintf("kubectl label namespace %s %s=%s --overwrite", ns, c.Key, c.Value)
}

// NamespaceExclusion finds a label change on namespace ns (current labels
// nsLabels, without kubernetes.io/metadata.name being required) that makes
// sel stop matching it, and returns the kubectl command. hints offers values
// for keys whose requirement accepts any value (DoesNotExist), e.g. the
// labels the webhook's own pods carry, so that "control-plane" becomes
// "control-plane=controller-manager" rather than an arbitrary word. Each
// candidate is re-evaluated against sel; the command is returned only when
// the change works. ok is false when no label change can exclude ns (for
// example an empty selector, or one on kubernetes.io/metadata.name only).
func NamespaceExclusion(sel *metav1.LabelSelector, ns string, nsLabels, hints map[string]string) (cmd string, ok bool) {
	if sel == nil {
		return "", false
	}
	current := namespaceLabels(ns, nsLabels)
	var candidates []labelChange
	keys := slices.Sorted(maps.Keys(sel.MatchLabels))
	for _, k := range keys {
		candidates = append(candidates, labelChange{Key: k, Remove: true})
	}
	for _, r := range sel.MatchExpressions {
		switch r.Operator {
		case metav1.LabelSelectorOpNotIn:
			for _, v := range r.Values {
				candidates = append(candidates, labelChange{Key: r.Key, Value: v})
			}
		case metav1.LabelSelectorOpDoesNotExist:
			v := hints[r.Key]
			if v == "" || len(validation.IsValidLabelValue(v)) > 0 {
				v = "true"
			}
			candidates = append(candidates, labelChange{Key: r.Key, Value: v})
		case metav1.LabelSelectorOpIn, metav1.LabelSelectorOpExists:
			candidates = append(candidates, labelChange{Key: r.Key, Remove: true})
		}
	}
	for _, c := range candidates {
		// The API server owns kubernetes.io/metadata.name and resets it.
		if c.Key == metadataNameLabel {
			continue
		}
		if c.Remove {
			if _, has := current[c.Key]; !has {
				continue
			}
		}
		if match, err := SelectorMatches(sel, c.apply(current)); err == nil && !match {
			return c.kubectl(ns), true
		}
	}
	return "", false
}

// excludeNamespacePatch is the kubectl command adding "kubernetes.io/
// metadata.name NotIn [ns]" to w's namespaceSelector: the manifest change
// when no namespace label can exclude ns.
func excludeNamespacePatch(w *Webhook, ns string) string {
	req := metav1.LabelSelectorRequirement{Key: metadataNameLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{ns}}
	var op map[string]any
	if len(w.NamespaceSelector.MatchExpressions) > 0 {
		op = map[string]any{"op": "add", "path": fmt.Sprintf("/webhooks/%d/namespaceSelector/matchExpressions/-", w.Index), "value": req}
	} else {
		sel := w.NamespaceSelector.DeepCopy()
		sel.MatchExpressions = []metav1.LabelSelectorRequirement{req}
		op = map[string]any{"op": "add", "path": fmt.Sprintf("/webhooks/%d/namespaceSelector", w.Index), "value": sel}
	}
	return jsonPatchCommand(w, []map[string]any{op})
}

// jsonPatchCommand renders `kubectl patch <kind> <name> --type=json -p '...'`.
func jsonPatchCommand(w *Webhook, ops []map[string]any) string {
	data, _ := json.Marshal(ops) // maps of strings and selectors always encode
	return fmt.Sprintf("kubectl patch %s %s --type=json -p '%s'", w.resourceKind(), w.Configuration, data)
}

// shellQuote quotes s for a POSIX shell when it holds anything but safe
// characters.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
