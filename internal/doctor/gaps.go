package doctor

import (
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// AccessGap is something doctor could not read: a verb on a resource (in a
// namespace, or cluster-wide) that the API server refused or does not
// serve, and what the checks therefore could not tell. Gaps are recorded in
// the Snapshot, never turned into errors: a diagnosis run with partial read
// access says "cannot tell" instead of guessing.
type AccessGap struct {
	// Verb is the API verb refused: "get" or "list".
	Verb string `json:"verb"`
	// Resource is the plural resource, with its group when not core:
	// "replicasets.apps", "pods".
	Resource string `json:"resource"`
	// Namespace is where the read was made; "" for cluster scope.
	Namespace string `json:"namespace,omitempty"`
	// Reason is "forbidden" or "not served".
	Reason string `json:"reason"`
	// Lost says which checks could not be made, or made only in part.
	Lost string `json:"lost"`
}

func newGap(verb, resource, group, ns string, err error, lost string) AccessGap {
	g := AccessGap{Verb: verb, Resource: resource, Namespace: ns, Lost: lost, Reason: "forbidden"}
	if group != "" {
		g.Resource += "." + group
	}
	if err != nil && !apierrors.IsForbidden(err) {
		g.Reason = "not served"
	}
	return g
}

// String renders the gap as the kubectl auth can-i question it answers.
func (g AccessGap) String() string {
	where := " (cluster-wide)"
	if g.Namespace != "" {
		where = " in namespace " + g.Namespace
	}
	return fmt.Sprintf("%s %s%s: %s", g.Verb, g.Resource, where, g.Reason)
}

// finding turns a gap into the info finding KD001.
func (g AccessGap) finding() Finding {
	f := Finding{ID: IDAccessGap, Severity: SeverityInfo,
		What: fmt.Sprintf("Doctor could not %s %s%s (%s).", g.Verb, g.Resource, nsClause(g.Namespace), g.Reason),
		Why:  "Cannot tell " + g.Lost + ".",
	}
	if g.Reason == "forbidden" {
		ns := ""
		if g.Namespace != "" {
			ns = " -n " + g.Namespace
		}
		f.Fix = fmt.Sprintf("kubectl auth can-i %s %s%s  # grant it (read-only) to whoever runs doctor for a complete diagnosis", g.Verb, g.Resource, ns)
	}
	return f
}

func nsClause(ns string) string {
	if ns == "" {
		return " cluster-wide"
	}
	return " in namespace " + ns
}

// gapFindings turns gaps into findings, one per distinct gap.
func gapFindings(gaps []AccessGap) []Finding {
	seen := map[string]bool{}
	var out []Finding
	for _, g := range gaps {
		k := g.String()
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, g.finding())
	}
	return out
}

// cannotTell prefixes a downgraded finding's What.
func cannotTell(what string, reasons []string) string {
	return what + " Doctor cannot tell for sure: " + strings.Join(reasons, "; ") + "."
}
