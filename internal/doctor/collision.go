package doctor

import (
	"maps"
	"slices"
	"sort"
	"strings"
)

// WorkloadRef names the top-level controller of a pod: Kind is e.g.
// "Deployment", "StatefulSet", "ReplicaSet" (no Deployment above it), or
// "Pod" for a pod without a controller.
type WorkloadRef struct {
	Kind, Name string
}

func (w WorkloadRef) String() string { return w.Kind + "/" + w.Name }

// PodInfo is what collision detection needs to know about one pod behind a
// Service.
type PodInfo struct {
	Name      string
	Namespace string
	Labels    map[string]string
	// Workload is the top-level controller found by following controller
	// owner references (Pod -> ReplicaSet -> Deployment).
	Workload WorkloadRef
	// Address is the pod's endpoint address when it is in an EndpointSlice.
	Address string
	// Inferred says how Workload was found when part of the owner chain
	// could not be read; Unconfirmed is true when no object doctor read
	// confirms it (see Backend.resolveOwner).
	Inferred    string
	Unconfirmed bool
}

// appLabels identify an application when owner references do not: pods
// without a controller are grouped by these.
var appLabels = []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component", "app", "k8s-app", "component"}

// WorkloadGroup is the pods of one workload behind a Service.
type WorkloadGroup struct {
	Workload WorkloadRef
	Pods     []string // pod names, sorted
	// Addresses of the group's pods found in the EndpointSlices, sorted.
	Addresses []string
	pods      []PodInfo
}

// Collision is the result of FindCollision when a Service routes to more than
// one workload.
type Collision struct {
	// Groups are the workloads, the intended one first when known.
	Groups []WorkloadGroup
	// Intended is true when Groups[0] is known to be the Service's own
	// workload (it serves a valid certificate, or its name matches).
	Intended bool
	// LabelKey and LabelValue are a label every pod of Groups[0] carries with
	// one value and no pod of another group carries with that value: adding
	// it to the Service's selector routes calls to Groups[0] only. Empty when
	// no such label exists (then the pod template needs one first).
	LabelKey, LabelValue string
	// Proven is true when at least two groups rest on owners doctor read
	// (or inferred and confirmed by a Deployment it read): only then is the
	// collision an error. Otherwise Unsure lists the inferences it rests on.
	Proven bool
	Unsure []string
}

// FindCollision groups pods by workload and returns nil when they all belong
// to one. serviceName helps pick the intended workload by name; preferred,
// when not nil, marks workloads known to be right (e.g. their pods present a
// certificate valid for the Service), which wins over the name. Pods of one
// workload must be listed with the same Workload.
func FindCollision(serviceName string, pods []PodInfo, preferred func(WorkloadRef) bool) *Collision {
	byRef := map[WorkloadRef]*WorkloadGroup{}
	var order []WorkloadRef
	for _, p := range pods {
		ref := p.Workload
		if ref.Kind == "" || ref.Kind == "Pod" {
			ref = appIdentity(p)
		}
		g, ok := byRef[ref]
		if !ok {
			g = &WorkloadGroup{Workload: ref}
			byRef[ref] = g
			order = append(order, ref)
		}
		g.pods = append(g.pods, p)
		g.Pods = append(g.Pods, p.Name)
		if p.Address != "" {
			g.Addresses = append(g.Addresses, p.Address)
		}
	}
	if len(order) < 2 {
		return nil
	}
	known := 0
	var unsure []string
	for _, r := range order {
		sure := false
		for _, p := range byRef[r].pods {
			if !p.Unconfirmed {
				sure = true
			} else if p.Inferred != "" {
				unsure = append(unsure, "pod "+p.Name+": "+p.Inferred)
			}
		}
		if sure {
			known++
		}
	}
	groups := make([]WorkloadGroup, 0, len(order))
	for _, r := range order {
		g := byRef[r]
		sort.Strings(g.Pods)
		sort.Strings(g.Addresses)
		groups = append(groups, *g)
	}
	sort.Slice(groups, func(a, b int) bool { return groups[a].Workload.String() < groups[b].Workload.String() })

	c := &Collision{Groups: groups, Proven: known >= 2}
	if !c.Proven {
		c.Unsure = unsure
	}
	intended := -1
	if preferred != nil {
		var hits []int
		for i, g := range groups {
			if preferred(g.Workload) {
				hits = append(hits, i)
			}
		}
		if len(hits) == 1 {
			intended = hits[0]
		}
	}
	if intended < 0 {
		intended = bestNameMatch(serviceName, groups)
	}
	if intended >= 0 {
		c.Intended = true
		c.Groups[0], c.Groups[intended] = c.Groups[intended], c.Groups[0]
	}
	c.LabelKey, c.LabelValue = distinguishingLabel(c.Groups)
	return c
}

// NarrowedSelector is the Service selector sel once KD301's fix is
// applied: sel plus LabelKey=LabelValue (the fix is a merge patch, which
// adds the label). ok is false when there is no distinguishing label. Every
// check that needs "the webhook's own pods" after a collision uses this, so
// that they agree with KD301's fix.
func (c *Collision) NarrowedSelector(sel map[string]string) (narrowed map[string]string, ok bool) {
	if c.LabelKey == "" {
		return nil, false
	}
	narrowed = make(map[string]string, len(sel)+1)
	for k, v := range sel {
		narrowed[k] = v
	}
	narrowed[c.LabelKey] = c.LabelValue
	return narrowed, true
}

// Others names the workloads of Groups[1:], the ones the Service should
// not select when Intended.
func (c *Collision) Others() string {
	var names []string
	for _, g := range c.Groups[1:] {
		names = append(names, g.Workload.String())
	}
	return strings.Join(names, ", ")
}

// appIdentity groups controller-less pods by their app labels, so two bare
// pods of one application are not a collision but pods of two are.
func appIdentity(p PodInfo) WorkloadRef {
	var parts []string
	for _, k := range appLabels {
		if v, ok := p.Labels[k]; ok {
			parts = append(parts, k+"="+v)
		}
	}
	if len(parts) == 0 {
		return WorkloadRef{Kind: "Pod", Name: p.Name}
	}
	return WorkloadRef{Kind: "Pods", Name: strings.Join(parts, ",")}
}

// bestNameMatch returns the index of the group whose workload name shares
// the longest leading dash-separated words with the Service name ("lws" in
// lws-webhook-service and lws-controller-manager), or -1 on a tie or no
// shared word.
func bestNameMatch(service string, groups []WorkloadGroup) int {
	svcWords := strings.Split(service, "-")
	best, bestScore, tie := -1, 0, false
	for i, g := range groups {
		words := strings.Split(g.Workload.Name, "-")
		score := 0
		for score < len(words) && score < len(svcWords) && words[score] == svcWords[score] {
			score++
		}
		switch {
		case score > bestScore:
			best, bestScore, tie = i, score, false
		case score == bestScore && score > 0:
			tie = true
		}
	}
	if tie {
		return -1
	}
	return best
}

// distinguishingLabel finds a label that all pods of groups[0] share and no
// pod of another group has with the same value, preferring the well-known
// app labels.
func distinguishingLabel(groups []WorkloadGroup) (string, string) {
	first := groups[0].pods
	if len(first) == 0 {
		return "", ""
	}
	keys := append([]string(nil), appLabels...)
	rest := slices.Sorted(maps.Keys(first[0].Labels))
	keys = append(keys, rest...)
	// pod-template-hash differs per ReplicaSet revision: a selector on it
	// would break at the next rollout.
	for _, k := range keys {
		if k == "pod-template-hash" || k == "controller-revision-hash" || k == "statefulset.kubernetes.io/pod-name" {
			continue
		}
		v, ok := first[0].Labels[k]
		if !ok {
			continue
		}
		uniform := true
		for _, p := range first[1:] {
			if p.Labels[k] != v {
				uniform = false
				break
			}
		}
		if !uniform {
			continue
		}
		clash := false
		for _, g := range groups[1:] {
			for _, p := range g.pods {
				if pv, has := p.Labels[k]; has && pv == v {
					clash = true
				}
			}
		}
		if !clash {
			return k, v
		}
	}
	return "", ""
}
