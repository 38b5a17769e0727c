package served

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/config"
	"github.com/kadmit/kadmit/internal/policy"
)

// ChartCachesPath is the chart template, relative to the repository root,
// that ChartCachesTemplate generates (`make generate`).
const ChartCachesPath = "deploy/helm/kadmit/templates/_policycaches.tpl"

// chartSection says how the chart's values turn on a built-in policy's
// cluster reads beyond `enabled`: what Sources.Caches computes in Go from a
// parsed configuration, the chart must decide in Helm from .Values.config.
// The generator does not copy these conditions: it learns which reads each
// one turns on by evaluating the policy's Caches (policy.Definition.Caches)
// on probe configurations, and fails when a read appears that no listed
// fact explains. A policy whose reads depend on `enabled` alone needs no
// entry.
type chartSection struct {
	// Off is the section's fields (JSON) with every fact false, merged
	// over {"enabled": true}; also what an enabled section needs to parse.
	Off string
	// Facts turn reads on, each alone on top of Off.
	Facts []chartFact
	// Namespace is the section's field naming the namespace its
	// namespaced reads are limited to (clustercache.Resource.Namespace).
	Namespace string
}

// chartFact is one fact of a configuration section the chart tests.
type chartFact struct {
	// Flag is a field whose truth turns reads on; or Item, with List, is
	// a field of the items of the list field List, any item setting it
	// turning reads on.
	Flag, List, Item string
	// On is the section's fields (JSON) making the fact true.
	On string
}

// chartSections are the facts of the built-in policies whose reads depend
// on more than `enabled`, by section key (Entry.Key).
var chartSections = map[string]chartSection{
	"jobQueue": {Facts: []chartFact{{Flag: "manageJobsWithoutQueueName", On: `{"manageJobsWithoutQueueName": true}`}}},
	"reservation": {Facts: []chartFact{
		{Flag: "checkAllocations", On: `{"checkAllocations": true}`},
		{List: "profiles", Item: "priorityClassName", On: `{"profiles": [{"name": "p", "selector": {"matchLabels": {"a": "b"}}, "priorityClassName": "koord-batch"}]}`},
	}},
	"colocation": {Facts: []chartFact{
		{List: "profiles", Item: "namespaceSelector", On: `{"profiles": [{"name": "p", "selector": {"matchLabels": {"a": "b"}}, "namespaceSelector": {"matchLabels": {"a": "b"}}}]}`},
		{List: "profiles", Item: "priorityClassName", On: `{"profiles": [{"name": "p", "selector": {"matchLabels": {"a": "b"}}, "priorityClassName": "koord-batch"}]}`},
	}},
	// Needs its ConfigMap's name to be enabled; reads nothing.
	"kadmitConfig": {Off: `{"namespace": "kadmit-system", "name": "kadmit"}`},
	"sloConfig":    {Off: `{"nodeCheck": false}`, Namespace: "namespace", Facts: []chartFact{{Flag: "nodeCheck", On: `{"nodeCheck": true}`}}},
}

// chartCondition is one condition under which a resource is read: a
// built-in policy enabled and, with fact, that fact true; or declared
// policies configured (policies.configMap).
type chartCondition struct {
	policy, key string
	enabled     bool // the section's default `enabled`
	fact        *chartFact
	flagDefault string // JSON of fact.Flag's default value
	declared    bool
}

// chartRead is one resource the chart grants list and watch on, with the
// conditions (any of them) under which it does.
type chartRead struct {
	Group, Resource string
	// namespaced reads are granted by a Role in the namespace the
	// section's nsField names (default nsDefault).
	namespaced         bool
	nsField, nsDefault string
	conditions         []chartCondition
}

// probeNamespace is the namespace probes set to see a namespaced read
// follow its section's Namespace field.
const probeNamespace = "kadmit-probe-namespace"

// chartReads evaluates every policy of reg's Caches on probe
// configurations (chartSections) and the declared policies' (Sources with
// Declared) and returns what the chart must grant, cluster-wide reads in
// registry order, then namespaced ones.
func chartReads(reg policy.Registry) ([]chartRead, error) {
	loader := config.Loader{Registry: reg}
	var reads []chartRead
	add := func(r clustercache.Read, c chartCondition, ns string, nsDefault string) {
		namespaced := r.Namespace != ""
		for i := range reads {
			if reads[i].Group == r.Group && reads[i].Resource == r.GroupVersionResource.Resource && reads[i].namespaced == namespaced &&
				(!namespaced || reads[i].conditions[0].key == c.key) {
				if !slices.ContainsFunc(reads[i].conditions, func(o chartCondition) bool { return o.key == c.key && o.fact == c.fact && o.declared == c.declared }) {
					reads[i].conditions = append(reads[i].conditions, c)
				}
				return
			}
		}
		reads = append(reads, chartRead{Group: r.Group, Resource: r.GroupVersionResource.Resource, namespaced: namespaced,
			nsField: ns, nsDefault: nsDefault, conditions: []chartCondition{c}})
	}
	for key := range chartSections {
		if _, ok := reg.Lookup(key); !ok {
			return nil, fmt.Errorf("chartSections[%q]: no policy of the registry has that section key", key)
		}
	}
	defaults := loader.Default()
	for _, entry := range reg {
		key := entry.Key()
		sec := chartSections[key]
		def, _ := defaults.Section(key)
		var defFields map[string]json.RawMessage
		if raw, err := json.Marshal(def.Config()); err != nil {
			return nil, fmt.Errorf("policy %s: default configuration: %w", entry.Name(), err)
		} else if err := json.Unmarshal(raw, &defFields); err != nil {
			return nil, fmt.Errorf("policy %s: default configuration: %w", entry.Name(), err)
		}
		base := chartCondition{policy: entry.Name(), key: key, enabled: def.Enabled()}
		probe := func(fields ...string) ([]clustercache.Read, error) {
			return probeReads(loader, key, fields...)
		}
		off, err := probe(sec.Off)
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", entry.Name(), err)
		}
		nsDefault := ""
		if sec.Namespace != "" {
			if err := json.Unmarshal(defFields[sec.Namespace], &nsDefault); err != nil {
				return nil, fmt.Errorf("policy %s: default of its namespace field %s: %w", entry.Name(), sec.Namespace, err)
			}
		}
		record := func(rs []clustercache.Read, c chartCondition) error {
			for _, r := range rs {
				if r.Namespace != "" {
					if sec.Namespace == "" {
						return fmt.Errorf("policy %s reads %s in namespace %s: name the section field that sets the namespace (chartSections[%q].Namespace)", entry.Name(), r.GroupVersionResource.Resource, r.Namespace, key)
					}
					if r.Namespace != nsDefault {
						return fmt.Errorf("policy %s reads %s in namespace %s, not in its %s field's default %q", entry.Name(), r.GroupVersionResource.Resource, r.Namespace, sec.Namespace, nsDefault)
					}
				}
				add(r, c, sec.Namespace, nsDefault)
			}
			return nil
		}
		if err := record(off, base); err != nil {
			return nil, err
		}
		explained := slices.Clone(off)
		all := []string{sec.Off}
		for i := range sec.Facts {
			f := &sec.Facts[i]
			on, err := probe(sec.Off, f.On)
			if err != nil {
				return nil, fmt.Errorf("policy %s, fact %s: %w", entry.Name(), f.describe(), err)
			}
			c := base
			c.fact = f
			if f.Flag != "" {
				c.flagDefault = "false"
				if v, ok := defFields[f.Flag]; ok {
					c.flagDefault = string(v)
				}
			}
			added := minus(on, off)
			if len(added) == 0 {
				return nil, fmt.Errorf("policy %s: fact %s turns no read on: drop it from chartSections", entry.Name(), f.describe())
			}
			if err := record(added, c); err != nil {
				return nil, err
			}
			explained = append(explained, added...)
			all = append(all, f.On)
		}
		// Every fact at once must read nothing the facts alone did not: a
		// read that needs two facts together has no condition here.
		together, err := probe(all...)
		if err != nil {
			return nil, fmt.Errorf("policy %s, every fact: %w", entry.Name(), err)
		}
		if extra := minus(together, explained); len(extra) > 0 {
			return nil, fmt.Errorf("policy %s reads %s only with several facts together: add a fact to chartSections[%q]", entry.Name(), extra[0].Resource, key)
		}
		if sec.Namespace != "" {
			moved, err := probe(append(all, fmt.Sprintf(`{%q: %q}`, sec.Namespace, probeNamespace))...)
			if err != nil {
				return nil, fmt.Errorf("policy %s, namespace probe: %w", entry.Name(), err)
			}
			for _, r := range moved {
				if r.Namespace != "" && r.Namespace != probeNamespace {
					return nil, fmt.Errorf("policy %s reads %s in namespace %s although its %s field says %s", entry.Name(), r.Resource, r.Namespace, sec.Namespace, probeNamespace)
				}
			}
		}
	}
	for _, r := range (Sources{Declared: &Declared{}}).Caches() {
		if r.Namespace != "" {
			return nil, errors.New("declared policies read a namespaced cache: the chart generator does not grant one")
		}
		add(r, chartCondition{policy: "declared policies", declared: true}, "", "")
	}
	var cluster, namespaced []chartRead
	for _, r := range reads {
		if r.namespaced {
			namespaced = append(namespaced, r)
		} else {
			cluster = append(cluster, r)
		}
	}
	return append(cluster, namespaced...), nil
}

func (f *chartFact) describe() string {
	if f.Flag != "" {
		return f.Flag
	}
	return f.List + "[]." + f.Item
}

// probeReads parses a configuration whose section key is {"enabled": true}
// with fields (JSON objects) merged over it, later ones winning, and
// returns that section's reads.
func probeReads(loader config.Loader, key string, fields ...string) ([]clustercache.Read, error) {
	section := map[string]any{}
	for _, f := range fields {
		if f == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(f), &m); err != nil {
			return nil, fmt.Errorf("probe fields %s: %w", f, err)
		}
		for k, v := range m {
			section[k] = v
		}
	}
	section["enabled"] = true
	raw, err := json.Marshal(map[string]any{"apiVersion": config.APIVersion, "kind": config.Kind, "policies": map[string]any{key: section}})
	if err != nil {
		return nil, err
	}
	cfg, err := loader.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("probe configuration %s: %w", raw, err)
	}
	s, _ := cfg.Section(key)
	return s.Caches(), nil
}

// minus returns the reads of a whose resource (group, resource,
// namespace) b does not read.
func minus(a, b []clustercache.Read) []clustercache.Read {
	var out []clustercache.Read
	for _, r := range a {
		if !slices.ContainsFunc(b, func(o clustercache.Read) bool { return o.Resource == r.Resource }) {
			out = append(out, r)
		}
	}
	return out
}

// ChartCachesTemplate returns the chart template ChartCachesPath holds for
// the registry reg (builtin.Registry; another in a test adding a policy):
// the RBAC for the cluster caches its policies and the declared policies
// read, generated from their Go declarations (policy.Definition.Caches,
// celpolicy.Caches) by evaluating them on probe configurations. An error
// names the policy whose reads the chart cannot express (see chartSections).
func ChartCachesTemplate(reg policy.Registry) ([]byte, error) {
	reads, err := chartReads(reg)
	if err != nil {
		return nil, fmt.Errorf("chart RBAC for policy caches: %w", err)
	}
	return renderChartReads(reads), nil
}

// helm returns the Helm condition c, as template actions setting $on.
func (c chartCondition) helm() string {
	if c.declared {
		return `{{- if dig "configMap" "" (.Values.policies | default dict) }}{{ $on = true }}{{ end }}`
	}
	enabled := fmt.Sprintf(`dig "policies" %q "enabled" %t .Values.config`, c.key, c.enabled)
	switch {
	case c.fact == nil:
		return fmt.Sprintf(`{{- if %s }}{{ $on = true }}{{ end }}`, enabled)
	case c.fact.Flag != "":
		return fmt.Sprintf(`{{- if and (%s) (dig "policies" %q %q %s .Values.config) }}{{ $on = true }}{{ end }}`, enabled, c.key, c.fact.Flag, c.flagDefault)
	}
	return fmt.Sprintf(`{{- if %s }}{{ range (dig "policies" %q %q list .Values.config) }}{{ if .%s }}{{ $on = true }}{{ end }}{{ end }}{{ end }}`, enabled, c.key, c.fact.List, c.fact.Item)
}

// String names c for the rule's comment: "job-queue (jobQueue.enabled)".
func (c chartCondition) String() string {
	switch {
	case c.declared:
		return "declared policies (policies.configMap)"
	case c.fact == nil:
		return fmt.Sprintf("%s (%s.enabled)", c.policy, c.key)
	}
	return fmt.Sprintf("%s (%s.%s)", c.policy, c.key, c.fact.describe())
}

func (r chartRead) comment() string {
	names := make([]string, len(r.conditions))
	for i, c := range r.conditions {
		names[i] = c.String()
	}
	return strings.Join(names, ", ")
}

func (r chartRead) rule(indent string) string {
	return fmt.Sprintf("%s- apiGroups: [%q]\n%s  resources: [%q]\n%s  verbs: [\"list\", \"watch\"]\n", indent, r.Group, indent, r.Resource, indent)
}

// renderChartReads writes the template: kadmit.policyCacheRules, the
// ClusterRole rules of the cluster-wide reads, and kadmit.policyCacheRoles,
// a Role and RoleBinding per policy with namespaced reads.
func renderChartReads(reads []chartRead) []byte {
	var b bytes.Buffer
	b.WriteString(`{{- /*
Code generated by ` + "`make generate`" + ` (go run ./internal/served/chartrbac) from
the cluster caches the built-in policies declare (policy.Definition.Caches)
and the declared policies read (celpolicy.Caches), as served.Sources.Caches
lists them. DO NOT EDIT: change the Go declaration and run make generate;
internal/served's TestChartCachesGenerated fails while this file differs.
*/ -}}

{{- /*
kadmit.policyCacheRules: the ClusterRole rules for the cluster-wide
informer caches: list and watch on each resource, only when .Values
enables a policy that reads it. Empty when none does.
*/ -}}
{{- define "kadmit.policyCacheRules" -}}
{{- $on := false }}
`)
	first := true
	for _, r := range reads {
		if r.namespaced {
			continue
		}
		if !first {
			b.WriteString("{{- $on = false }}\n")
		}
		first = false
		for _, c := range r.conditions {
			b.WriteString(c.helm() + "\n")
		}
		fmt.Fprintf(&b, "{{- if $on }}\n# %s\n%s{{- end }}\n", r.comment(), r.rule(""))
	}
	b.WriteString(`{{- end -}}

{{- /*
kadmit.policyCacheRoles: for each policy whose cache is limited to one
namespace, a Role there (and its RoleBinding) granting list and watch on
that namespace only, never the cluster's. Each document starts with ---.
*/ -}}
{{- define "kadmit.policyCacheRoles" -}}
{{- $on := false }}
`)
	first = true
	var keys []string
	for _, r := range reads {
		if r.namespaced && !slices.Contains(keys, r.conditions[0].key) {
			keys = append(keys, r.conditions[0].key)
		}
	}
	for _, key := range keys {
		var rs []chartRead
		for _, r := range reads {
			if r.namespaced && r.conditions[0].key == key {
				rs = append(rs, r)
			}
		}
		policy := rs[0].conditions[0].policy
		name := fmt.Sprintf(`{{ printf "%%s-%s-reads" (include "kadmit.fullname" $) }}`, policy)
		for _, r := range rs {
			if !first {
				b.WriteString("{{- $on = false }}\n")
			}
			first = false
			for _, c := range r.conditions {
				b.WriteString(c.helm() + "\n")
			}
			fmt.Fprintf(&b, "{{- $%s := $on }}\n", varName(r))
		}
		var any []string
		for _, r := range rs {
			any = append(any, "$"+varName(r))
		}
		cond := any[0]
		if len(any) > 1 {
			cond = "or " + strings.Join(any, " ")
		}
		fmt.Fprintf(&b, `{{- if %s }}
{{- $readNS := dig "policies" %q %q %q .Values.config }}
---
# %s: namespace {{ $readNS }} only (%s).
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: %s
  namespace: {{ $readNS }}
  labels:
    {{- include "kadmit.labels" $ | nindent 4 }}
rules:
`, cond, key, rs[0].nsField, rs[0].nsDefault, policy, key+"."+rs[0].nsField, name)
		for _, r := range rs {
			if len(rs) > 1 {
				fmt.Fprintf(&b, "  {{- if $%s }}\n  # %s\n%s  {{- end }}\n", varName(r), r.comment(), r.rule("  "))
			} else {
				fmt.Fprintf(&b, "  # %s\n%s", r.comment(), r.rule("  "))
			}
		}
		fmt.Fprintf(&b, `---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: %s
  namespace: {{ $readNS }}
  labels:
    {{- include "kadmit.labels" $ | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: %s
subjects:
  - kind: ServiceAccount
    name: {{ include "kadmit.serviceAccountName" $ }}
    namespace: {{ include "kadmit.namespace" $ }}
{{- end }}
`, name, name)
	}
	b.WriteString("{{- end -}}\n")
	return b.Bytes()
}

// varName is a template variable name for r's condition.
func varName(r chartRead) string {
	name := "read_" + r.Resource
	if r.Group != "" {
		name += "_" + r.Group
	}
	return strings.NewReplacer(".", "_", "-", "_").Replace(name)
}

// chartDiff compares the committed template with the generated one and
// returns nil when they are equal, else an error naming the first line
// that differs (1-based) and both versions of it.
func chartDiff(committed, generated []byte) error {
	if bytes.Equal(committed, generated) {
		return nil
	}
	c, g := strings.Split(string(committed), "\n"), strings.Split(string(generated), "\n")
	for i := 0; ; i++ {
		var cl, gl string
		if i < len(c) {
			cl = c[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if cl != gl || i >= len(c) || i >= len(g) {
			return fmt.Errorf("%s differs from the policies' declared caches at line %d:\n  committed: %q\n  generated: %q\nrun make generate", ChartCachesPath, i+1, cl, gl)
		}
	}
}
