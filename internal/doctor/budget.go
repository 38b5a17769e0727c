package doctor

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// KD608: the timeout budget of one request. How the API server spends it
// (k8s.io/apiserver v0.37.1):
//
//   - pkg/admission/plugin/webhook/mutating/dispatcher.go (Dispatch): the
//     mutating webhooks a request matches are called one after another,
//     each bounded by its own timeoutSeconds (callAttrMutatingHook,
//     context.WithTimeout); a webhook with failurePolicy Ignore that times
//     out lets the request go on to the next one, unless the request's own
//     context has ended ("request did not complete within requested
//     timeout").
//   - pkg/admission/reinvocation.go (reinvoker.Admit): when a webhook or
//     plugin changed the object after a webhook with reinvocationPolicy
//     IfNeeded ran, the whole mutating chain runs once more, and those
//     webhooks are called again (mutating/reinvocationcontext.go): each
//     IfNeeded webhook can take its timeout twice.
//   - pkg/admission/plugin/webhook/validating/dispatcher.go (Dispatch): the
//     validating webhooks are called in parallel (one goroutine each,
//     wg.Wait): the slowest one counts.
//   - every call's context derives from the request's, which ends at the
//     API server's --request-timeout, 60s by default (pkg/server/config.go,
//     NewConfig: RequestTimeout), unless the client asked for less
//     (?timeout=).
//
// So the worst case of one request is the sum of its mutating webhooks'
// timeouts (twice for IfNeeded) plus the largest of its validating
// webhooks' timeouts, reached when they are slow or unreachable.

// Bounds a request's worst case is compared with (KD608).
const (
	// APIServerRequestTimeout is kube-apiserver's --request-timeout
	// default (k8s.io/apiserver v0.37.1 pkg/server/config.go:453). Past it
	// the request fails with "Timeout: request did not complete within
	// requested timeout" whatever the webhooks' failurePolicy. kubectl sets
	// no timeout of its own (--request-timeout "0", k8s.io/cli-runtime
	// v0.37.1 pkg/genericclioptions/config_flags.go:484), nor does
	// client-go (rest.Config.Timeout zero, client-go v0.37.1
	// rest/config.go:150), so for them and for controllers built on
	// client-go this is the bound.
	APIServerRequestTimeout = 60 * time.Second
	// HeartbeatTimeout is what the two clients that must renew an object
	// within a deadline wait for one renewal, by default:
	//   - the kubelet's node heartbeat (Lease in kube-node-lease and
	//     nodes/status): its client's timeout is min(nodeStatusUpdateFrequency,
	//     nodeLeaseDurationSeconds) (kubernetes v1.37.1
	//     cmd/kubelet/app/server.go:775-779), 10s and 40s by default
	//     (pkg/kubelet/apis/config/v1beta1/defaults.go:147,150);
	//   - leader election: a Lease update must succeed within RenewDeadline
	//     (client-go v0.37.1 tools/leaderelection/leaderelection.go:285), 10s
	//     in kube-controller-manager and kube-scheduler (component-base
	//     v0.37.1 config/v1alpha1/defaults.go:41) and in controller-runtime
	//     managers (pkg/manager/internal.go:55, v0.23 to v0.25).
	// A node whose heartbeat keeps timing out goes NotReady after
	// nodeLeaseDurationSeconds; a controller that cannot renew loses its
	// lease and restarts.
	HeartbeatTimeout = 10 * time.Second
)

// Bounds of KD608's own work and output.
const (
	// MaxBudgetRequests bounds the distinct (group, version, resource,
	// subresource, operation) requests the budget is computed for in one
	// run; past it the webhooks whose rules name further requests get a
	// KD003 note. 500 configurations of 10 webhooks naming a few resources
	// each stay far below it.
	MaxBudgetRequests = 100_000
	// maxBudgetFindings is the most KD608 findings one webhook gets (the
	// worst first; the last says how many more sets of webhooks exceed).
	maxBudgetFindings = 3
	// maxBudgetListed is the most webhooks one finding lists by name, and
	// maxBudgetRequestsListed the most requests.
	maxBudgetListed         = 12
	maxBudgetRequestsListed = 6
)

// budgetReq is one kind of request the budget is computed for. Group
// "*" stands for a group no rule names concretely (matched only by
// rules with apiGroups "*"); likewise version "*".
type budgetReq struct {
	group, version, resource, sub string
	op                            admissionregistrationv1.OperationType
	namespaced                    bool
}

func (q budgetReq) request() Request {
	return Request{Group: q.group, Version: q.version, Resource: q.resource, Subresource: q.sub, Operation: q.op, Namespaced: q.namespaced}
}

func (q budgetReq) String() string {
	res := q.resource
	if q.sub != "" {
		res += "/" + q.sub
	}
	gv := q.version
	switch {
	case q.group == "*":
		gv = "any group"
	case q.group != "":
		gv = q.group + "/" + q.version
	}
	return fmt.Sprintf("%s %s (%s)", q.op, res, gv)
}

// heartbeat reports whether q is a renewal HeartbeatTimeout bounds: a
// Lease update (node heartbeat, leader election) or a Node or
// nodes/status update (the kubelet's status heartbeat).
func (q budgetReq) heartbeat() bool {
	if q.op != admissionregistrationv1.Update {
		return false
	}
	switch {
	case q.group == "coordination.k8s.io" && q.resource == "leases" && q.sub == "":
		return true
	case q.group == "" && q.resource == "nodes" && (q.sub == "" || q.sub == "status"):
		return true
	}
	return false
}

// wellKnownRequests stand for "every resource" when rules name none
// concretely (two webhooks both on apiGroups "*", resources "*"): kinds
// every cluster serves, including the heartbeat ones.
var wellKnownRequests = []budgetReq{
	{group: "", version: "v1", resource: "pods", namespaced: true},
	{group: "", version: "v1", resource: "configmaps", namespaced: true},
	{group: "", version: "v1", resource: "secrets", namespaced: true},
	{group: "", version: "v1", resource: "services", namespaced: true},
	{group: "", version: "v1", resource: "serviceaccounts", namespaced: true},
	{group: "", version: "v1", resource: "namespaces"},
	{group: "", version: "v1", resource: "nodes"},
	{group: "", version: "v1", resource: "nodes", sub: "status"},
	{group: "apps", version: "v1", resource: "deployments", namespaced: true},
	{group: "apps", version: "v1", resource: "replicasets", namespaced: true},
	{group: "apps", version: "v1", resource: "statefulsets", namespaced: true},
	{group: "apps", version: "v1", resource: "daemonsets", namespaced: true},
	{group: "batch", version: "v1", resource: "jobs", namespaced: true},
	{group: "coordination.k8s.io", version: "v1", resource: "leases", namespaced: true},
}

// connectSubresources are the subresources CONNECT requests are made to
// (pods/exec, attach, portforward, proxy; nodes and services proxy).
var connectSubresources = map[string]bool{"exec": true, "attach": true, "portforward": true, "proxy": true}

// budgetBound is one limit a case exceeds.
type budgetBound struct {
	limit time.Duration
	// who waits that long, for What; why it matters, for Why.
	who, why string
}

var (
	boundAPIServer = budgetBound{APIServerRequestTimeout, "the API server's --request-timeout (60s by default; kubectl and client-go set none of their own)",
		"past it the API server ends the request with \"Timeout: request did not complete within requested timeout\" whatever the webhooks' failurePolicy (Ignore too), and the webhooks after that point are not called"}
	boundHeartbeat = budgetBound{HeartbeatTimeout, "the kubelet's heartbeat client and leader election's RenewDeadline (10s by default)",
		"a node whose Lease or status update times out goes NotReady after nodeLeaseDurationSeconds (40s), and a controller that cannot renew its leader-election Lease within RenewDeadline loses leadership and restarts"}
)

// budgetCase is one set of webhooks that can together exceed a bound for
// some requests.
type budgetCase struct {
	hooks []*Webhook // mutating first, in the API server's order, then validating
	// total is the worst case, seconds; validating is the slowest
	// validating webhook's timeout (0 when none).
	total, validating int
	bounds            []budgetBound // exceeded, tightest first
	reqs              []budgetReq   // at most maxBudgetRequestsListed
	nreqs             int
	// namespace is where the set applies, when namespaceSelectors narrow
	// the webhooks of a namespaced request ("" otherwise).
	namespace string
	unsure    []string
}

func (c *budgetCase) excess() int { return c.total - int(c.bounds[0].limit/time.Second) }

// budgetIndex is the per-run result: each webhook's cases (the worst
// maxBudgetFindings, and how many), and the webhooks whose requests were
// not all examined (MaxBudgetRequests).
type budgetIndex struct {
	byHook    map[*Webhook]*hookCases
	truncated map[*Webhook]bool
	examined  int
	limit     int // the bound examined stopped at (MaxBudgetRequests)
}

// hookCases are the worst maxBudgetFindings cases of one webhook, largest
// excess first (the earlier found first among equals), and how many it
// has in all: a webhook on "*" can take part in thousands.
type hookCases struct {
	top []*budgetCase
	n   int
}

func (h *hookCases) add(c *budgetCase) {
	h.n++
	i := len(h.top)
	for i > 0 && h.top[i-1].excess() < c.excess() {
		i--
	}
	if i >= maxBudgetFindings {
		return
	}
	h.top = slices.Insert(h.top, i, c)
	if len(h.top) > maxBudgetFindings {
		h.top = h.top[:maxBudgetFindings]
	}
}

// multiplier is how many times the API server may call w for one request:
// twice for a mutating webhook with reinvocationPolicy IfNeeded.
func multiplier(w *Webhook) int {
	if w.Kind == KindMutating && w.ReinvocationPolicy == admissionregistrationv1.IfNeededReinvocationPolicy {
		return 2
	}
	return 1
}

// worstCase is the sum of the mutating webhooks' timeouts (times
// multiplier) plus the slowest validating one's, seconds.
func worstCase(hooks []*Webhook) (total, validating int) {
	for _, w := range hooks {
		t := int(w.TimeoutSeconds)
		if w.Kind == KindMutating {
			total += t * multiplier(w)
		} else {
			validating = max(validating, t)
		}
	}
	return total + validating, validating
}

// timeoutBudget returns the run's budget index, computed once over every
// webhook of the snapshot (r.all), whatever the report is restricted to.
func (r *run) timeoutBudget() *budgetIndex {
	r.budgetOnce.Do(func() { r.budget = computeBudget(r.all, r.snap, MaxBudgetRequests) })
	return r.budget
}

// resKey is a request without its operation.
type resKey struct {
	group, version, resource, sub string
	namespaced                    bool
}

// computeBudget finds, for every request some rule names (and the
// well-known ones; at most limit requests), the webhooks whose rules match
// it (RuleMatches, the API server's matcher), and the cases where 2 or
// more of them exceed a bound.
//
// Cost: the webhooks are indexed by (group, resource) as their rules name
// them; a request is matched (RuleMatches) only against the webhooks under
// its own group and resource or "*" in one of them. Webhooks that are "*"
// in both (pureWildcard) are matched once per request signature (version,
// subresource, operation, scope), not per request. So the work grows with
// the requests times the webhooks naming their resource, not with the
// square of the webhooks. namespaceSelectors are evaluated only for sets
// that exceed a bound on rules alone, once per set (the wildcard
// webhooks' part once per signature and namespace), and each webhook keeps
// its worst maxBudgetFindings cases only.
func computeBudget(all []*Webhook, snap *Snapshot, limit int) *budgetIndex {
	bi := &budgetIndex{byHook: map[*Webhook]*hookCases{}, truncated: map[*Webhook]bool{}, limit: limit}
	type gr struct{ group, resource string }
	index := map[gr][]int{}
	versionsOf := orderedSets{} // group -> concrete versions rules name
	groupsOf := orderedSets{}   // resource -> concrete groups rules name
	var pure []int              // webhooks matching any group and resource (see below)
	for i, w := range all {
		isPure := pureWildcard(w.Rules)
		if isPure {
			pure = append(pure, i)
		}
		for _, rule := range w.Rules {
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					base, _, _ := strings.Cut(res, "/")
					k := gr{g, base}
					if l := index[k]; !isPure && (len(l) == 0 || l[len(l)-1] != i) {
						index[k] = append(l, i)
					}
					if g != "*" && base != "*" {
						groupsOf.add(base, g)
					}
				}
				if g == "*" {
					continue
				}
				for _, v := range rule.APIVersions {
					if v != "*" {
						versionsOf.add(g, v)
					}
				}
			}
		}
	}
	for _, q := range wellKnownRequests {
		groupsOf.add(q.resource, q.group)
		versionsOf.add(q.group, q.version)
	}

	// The requests, each resource with its operations, in a stable order.
	ops := map[resKey][]admissionregistrationv1.OperationType{}
	var order []resKey
	n := 0
	add := func(k resKey, op admissionregistrationv1.OperationType) bool {
		if slices.Contains(ops[k], op) {
			return true
		}
		if n >= limit {
			return false
		}
		if ops[k] == nil {
			order = append(order, k)
		}
		ops[k] = append(ops[k], op)
		n++
		return true
	}
	expand := func(op admissionregistrationv1.OperationType, sub string) []admissionregistrationv1.OperationType {
		if op != admissionregistrationv1.OperationAll {
			return []admissionregistrationv1.OperationType{op}
		}
		every := []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete}
		if connectSubresources[sub] {
			every = append(every, admissionregistrationv1.Connect)
		}
		return every
	}
	for _, q := range wellKnownRequests {
		k := resKey{q.group, q.version, q.resource, q.sub, q.namespaced}
		for _, op := range expand(admissionregistrationv1.OperationAll, q.sub) {
			add(k, op)
		}
	}
	for _, w := range all {
		for _, rule := range w.Rules {
			for _, res := range rule.Resources {
				base, sub, _ := strings.Cut(res, "/")
				if base == "*" {
					continue // "*" and "*/x" name no resource of their own
				}
				if sub == "*" {
					sub = "" // "pods/*" matches pods too
				}
				for _, g := range rule.APIGroups {
					groups := []string{g}
					if g == "*" {
						if groups = groupsOf.list(base); len(groups) == 0 {
							groups = []string{"*"}
						}
					}
					for _, cg := range groups {
						for _, v := range rule.APIVersions {
							versions := []string{v}
							if v == "*" && cg != "*" {
								if versions = versionsOf.list(cg); len(versions) == 0 {
									versions = []string{"v1"}
								}
							}
							for _, cv := range versions {
								k := resKey{cg, cv, base, sub, !clusterScoped[base]}
								for _, op := range rule.Operations {
									for _, eop := range expand(op, sub) {
										if !add(k, eop) {
											bi.truncated[w] = true
										}
									}
								}
							}
						}
					}
				}
			}
		}
	}
	bi.examined = n

	// Webhooks whose every rule is "*" in groups and resources match
	// whatever the group and resource: their matches depend only on the
	// version, subresource, operation and scope, and are computed once per
	// such signature rather than per request.
	// rank is each webhook's place in the API server's order.
	rank := make([]int, len(all))
	pos := make(map[*Webhook]int, len(all))
	for i, w := range sortedHooks(all) {
		pos[w] = i
	}
	for i, w := range all {
		rank[i] = pos[w]
	}
	type sig struct {
		version, sub string
		op           admissionregistrationv1.OperationType
		namespaced   bool
	}
	sigs := map[sig]*sigMatch{}
	members := map[string]*sigMatch{} // one per distinct set of wildcard webhooks
	pureMatches := func(q budgetReq) *sigMatch {
		k := sig{q.version, q.sub, q.op, q.namespaced}
		if m := sigs[k]; m != nil {
			return m
		}
		m := &sigMatch{}
		req := q.request()
		for _, i := range pure {
			if RuleMatches(all[i].Rules, req) {
				m.idx = append(m.idx, i)
				if w := all[i]; w.Kind == KindMutating {
					m.mut += int(w.TimeoutSeconds) * multiplier(w)
				} else {
					m.val = max(m.val, int(w.TimeoutSeconds))
				}
			}
		}
		slices.SortFunc(m.idx, func(a, b int) int { return rank[a] - rank[b] })
		// Signatures that select the same wildcard webhooks (CREATE and
		// UPDATE, v1 and v1beta1, ...) share one sigMatch, so their sets
		// are one.
		mk := fmt.Sprint(m.idx)
		if same := members[mk]; same != nil {
			m = same
		} else {
			m.id = len(members)
			members[mk] = m
		}
		sigs[k] = m
		return m
	}
	// A set (the webhooks a request matches) is refined once; sets that
	// refine to the same webhooks share their cases, one per tightest
	// bound.
	type caseGroup map[time.Duration]*budgetCase
	type setInfo struct {
		ref   refinement
		cases caseGroup
	}
	groups := map[string]caseGroup{}
	rf := &refiner{all: all, snap: snap, sels: map[int]labels.Selector{}, shared: map[int]*sharedPart{}}
	sets := map[string]*setInfo{}
	var caseOrder []*budgetCase
	stamp := make([]int, len(all))
	for i := range stamp {
		stamp[i] = -1
	}
	var cand, matched []int
	var key strings.Builder
	for ki, k := range order {
		cand = cand[:0]
		for _, gk := range []gr{{k.group, k.resource}, {"*", k.resource}, {k.group, "*"}, {"*", "*"}} {
			for _, i := range index[gk] {
				if stamp[i] != ki {
					stamp[i] = ki
					cand = append(cand, i)
				}
			}
		}
		if len(cand)+len(pure) < 2 {
			continue
		}
		for _, op := range ops[k] {
			q := budgetReq{k.group, k.version, k.resource, k.sub, op, k.namespaced}
			pm := pureMatches(q)
			if len(cand)+len(pm.idx) < 2 {
				continue
			}
			req := q.request()
			matched = matched[:0]
			mut, val := pm.mut, pm.val
			for _, i := range cand {
				if w := all[i]; RuleMatches(w.Rules, req) {
					matched = append(matched, i)
					if w.Kind == KindMutating {
						mut += int(w.TimeoutSeconds) * multiplier(w)
					} else {
						val = max(val, int(w.TimeoutSeconds))
					}
				}
			}
			if len(matched)+len(pm.idx) < 2 {
				continue
			}
			bounds := []budgetBound{boundAPIServer}
			if q.heartbeat() {
				bounds = []budgetBound{boundHeartbeat, boundAPIServer}
			}
			if time.Duration(mut+val)*time.Second <= bounds[0].limit {
				continue
			}
			slices.SortFunc(matched, func(a, b int) int { return rank[a] - rank[b] })
			key.Reset()
			// refine narrows namespaced requests and Namespaces alike.
			fmt.Fprintf(&key, "p%d|%t|", pm.id, q.namespaced || (q.group == "" && q.resource == "namespaces"))
			for _, i := range matched {
				key.WriteString(strconv.Itoa(i))
				key.WriteByte(',')
			}
			si := sets[key.String()]
			if si == nil {
				idx := mergeByRank(pm.idx, matched, rank)
				// The case is named by its members' ranks: sets that
				// namespaceSelectors narrow to the same webhooks are one.
				si = &setInfo{ref: rf.refine(pm, matched, idx, q)}
				var b strings.Builder
				for _, w := range si.ref.hooks {
					b.WriteString(strconv.Itoa(pos[w]))
					b.WriteByte(',')
				}
				if si.cases = groups[b.String()]; si.cases == nil {
					si.cases = caseGroup{}
					groups[b.String()] = si.cases
				}
				sets[key.String()] = si
			}
			ref := si.ref
			var exceeded []budgetBound
			for _, b := range bounds {
				if time.Duration(ref.total)*time.Second > b.limit {
					exceeded = append(exceeded, b)
				}
			}
			if len(ref.hooks) < 2 || len(exceeded) == 0 {
				continue
			}
			c := si.cases[exceeded[0].limit]
			if c == nil {
				c = &budgetCase{hooks: ref.hooks, bounds: exceeded, namespace: ref.namespace, unsure: ref.unsure}
				c.total, c.validating = worstCase(ref.hooks)
				si.cases[exceeded[0].limit] = c
				caseOrder = append(caseOrder, c)
			}
			c.nreqs++
			if len(c.reqs) < maxBudgetRequestsListed {
				c.reqs = append(c.reqs, q)
			}
		}
	}
	for _, c := range caseOrder {
		for _, w := range c.hooks {
			hc := bi.byHook[w]
			if hc == nil {
				hc = &hookCases{}
				bi.byHook[w] = hc
			}
			hc.add(c)
		}
	}
	return bi
}

// mergeByRank merges a and b, each sorted by rank, into a new slice
// sorted by rank.
func mergeByRank(a, b []int, rank []int) []int {
	out := make([]int, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if rank[a[0]] <= rank[b[0]] {
			out, a = append(out, a[0]), a[1:]
		} else {
			out, b = append(out, b[0]), b[1:]
		}
	}
	return append(append(out, a...), b...)
}

// orderedSets maps a key to a set of strings kept in insertion order.
type orderedSets map[string]*orderedSet

type orderedSet struct {
	seen  map[string]bool
	order []string
}

func (m orderedSets) add(k, v string) {
	s := m[k]
	if s == nil {
		s = &orderedSet{seen: map[string]bool{}}
		m[k] = s
	}
	if !s.seen[v] {
		s.seen[v] = true
		s.order = append(s.order, v)
	}
}

func (m orderedSets) list(k string) []string {
	if s := m[k]; s != nil {
		return s.order
	}
	return nil
}

// pureWildcard reports whether every rule has only "*" groups and only
// "*" resource bases ("*", "*/*", "*/status"): whether such rules match a
// request does not depend on its group or resource.
func pureWildcard(rules []admissionregistrationv1.RuleWithOperations) bool {
	for _, r := range rules {
		for _, g := range r.APIGroups {
			if g != "*" {
				return false
			}
		}
		for _, res := range r.Resources {
			if base, _, _ := strings.Cut(res, "/"); base != "*" {
				return false
			}
		}
	}
	return len(rules) > 0
}

// sortedHooks orders hooks as the API server calls them: mutating first,
// then validating, each by configuration name and position (the order
// k8s.io/apiserver's configuration managers list them in).
func sortedHooks(hooks []*Webhook) []*Webhook {
	out := slices.Clone(hooks)
	sort.SliceStable(out, func(a, b int) bool {
		x, y := out[a], out[b]
		if x.Kind != y.Kind {
			return x.Kind == KindMutating
		}
		if x.Configuration != y.Configuration {
			return x.Configuration < y.Configuration
		}
		return x.Index < y.Index
	})
	return out
}

// refinement is a set of webhooks narrowed to those that can apply to one
// request together.
type refinement struct {
	hooks     []*Webhook
	total     int
	namespace string
	unsure    []string
}

// refiner narrows sets of webhooks by their namespaceSelectors, with what
// every set shares computed once per run: the namespaces' label sets, each
// webhook's selector, and, per signature of the wildcard webhooks (their
// sigMatch), what they add up to in each namespace.
type refiner struct {
	all    []*Webhook
	snap   *Snapshot
	loaded bool
	names  []string // the snapshot's namespaces, sorted
	labels []labels.Set
	sels   map[int]labels.Selector
	shared map[int]*sharedPart // by sigMatch id
}

// sigMatch is the wildcard webhooks (pureWildcard) one request signature
// (version, subresource, operation, scope) matches, sorted in the API
// server's order; id names the set.
type sigMatch struct {
	id       int
	idx      []int
	mut, val int // their sum of mutating timeouts, slowest validating
}

// sharedPart is what a sigMatch's webhooks contribute to every set they
// are part of.
type sharedPart struct {
	conditional []string // names, with objectSelectors or matchConditions
	narrowed    bool     // some namespaceSelector is not empty
	per         [][2]int // per namespace (once loaded): mutating sum, slowest validating
}

func (f *refiner) selector(i int) labels.Selector {
	if s, ok := f.sels[i]; ok {
		return s
	}
	s, err := metav1.LabelSelectorAsSelector(f.all[i].NamespaceSelector)
	if err != nil {
		s = labels.Everything() // the API server refuses invalid selectors; count it
	}
	f.sels[i] = s
	return s
}

// refine narrows the webhooks idx (sorted in the API server's order: the
// wildcard ones of pm plus spec, all matching q by rules) to the largest
// worst case of the webhooks one request can meet: for a namespaced
// request (or a Namespace), those whose namespaceSelector selects the same
// namespace, over every namespace of the snapshot (with
// kubernetes.io/metadata.name, as the API server matches them).
// objectSelectors and matchConditions depend on the object and are not
// evaluated: they are named in unsure. What pm contributes is computed
// once (sharedPart), so a set costs its own webhooks times the namespaces.
func (f *refiner) refine(pm *sigMatch, spec, idx []int, q budgetReq) refinement {
	sp := f.shared[pm.id]
	if sp == nil {
		sp = &sharedPart{}
		for _, i := range pm.idx {
			w := f.all[i]
			if !emptySelector(w.ObjectSelector) || len(w.MatchConditions) > 0 {
				sp.conditional = append(sp.conditional, w.Name)
			}
			sp.narrowed = sp.narrowed || !emptySelector(w.NamespaceSelector)
		}
		f.shared[pm.id] = sp
	}
	conditional, narrowed := sp.conditional, sp.narrowed
	total := pm.mut + pm.val
	{
		mut, val := pm.mut, pm.val
		for _, i := range spec {
			w := f.all[i]
			if !emptySelector(w.ObjectSelector) || len(w.MatchConditions) > 0 {
				conditional = append(slices.Clip(conditional), w.Name)
			}
			narrowed = narrowed || !emptySelector(w.NamespaceSelector)
			f.add(i, &mut, &val)
		}
		total = mut + val
	}
	var unsure []string
	if len(conditional) > 0 {
		unsure = append(unsure, fmt.Sprintf("%s select(s) objects by objectSelector or matchConditions, which doctor does not evaluate here: for objects excluded there the sum is lower", strings.Join(budgetList(conditional, maxBudgetListed), ", ")))
	}
	all := func() refinement {
		hooks := make([]*Webhook, len(idx))
		for j, i := range idx {
			hooks[j] = f.all[i]
		}
		return refinement{hooks: hooks, total: total, unsure: unsure}
	}
	if !(q.namespaced || (q.group == "" && q.resource == "namespaces")) || !narrowed {
		return all()
	}
	if f.snap == nil || !f.snap.NamespacesKnown {
		r := all()
		r.unsure = append(r.unsure, "namespaces could not be listed, so the webhooks' namespaceSelectors were not applied: they may never select one namespace together")
		return r
	}
	if !f.loaded {
		f.loaded = true
		f.names = slices.Sorted(maps.Keys(f.snap.Namespaces))
		for _, ns := range f.names {
			f.labels = append(f.labels, labels.Set(namespaceLabels(ns, f.snap.Namespaces[ns])))
		}
	}
	if sp.per == nil {
		sp.per = make([][2]int, len(f.names))
		for j, set := range f.labels {
			for _, i := range pm.idx {
				if f.selector(i).Matches(set) {
					f.add(i, &sp.per[j][0], &sp.per[j][1])
				}
			}
		}
	}
	best, bestTotal := -1, -1
	for j, set := range f.labels {
		mut, val := sp.per[j][0], sp.per[j][1]
		for _, i := range spec {
			if f.selector(i).Matches(set) {
				f.add(i, &mut, &val)
			}
		}
		if t := mut + val; t > bestTotal {
			best, bestTotal = j, t
			if t == total {
				break // no namespace can do worse than all of them
			}
		}
	}
	if best < 0 {
		return refinement{unsure: unsure} // no namespace: nothing applies together
	}
	r := refinement{total: bestTotal, namespace: f.names[best], unsure: unsure, hooks: make([]*Webhook, 0, len(idx))}
	for _, i := range idx {
		if f.selector(i).Matches(f.labels[best]) {
			r.hooks = append(r.hooks, f.all[i])
		}
	}
	return r
}

// add adds webhook i's timeout to a worst case being summed.
func (f *refiner) add(i int, mut, val *int) {
	if w := f.all[i]; w.Kind == KindMutating {
		*mut += int(w.TimeoutSeconds) * multiplier(w)
	} else {
		*val = max(*val, int(w.TimeoutSeconds))
	}
}

func emptySelector(s *metav1.LabelSelector) bool {
	return s == nil || (len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0)
}

// budgetList keeps the first n of s, the last saying how many more.
func budgetList(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(slices.Clone(s[:n-1]), fmt.Sprintf("and %d more", len(s)-n+1))
}

// checkTimeoutBudget runs KD608 for w: each set of webhooks w belongs to
// that can together take longer than a bound for some request, at most
// maxBudgetFindings of them, the largest excess first.
func (r *run) checkTimeoutBudget(w *Webhook) []Finding {
	bi := r.timeoutBudget()
	var out []Finding
	if hc := bi.byHook[w]; hc != nil {
		for i, c := range hc.top {
			f := budgetFinding(w, c)
			if i == len(hc.top)-1 && hc.n > len(hc.top) {
				f.What += fmt.Sprintf(" %d more set(s) of webhooks with this one exceed a bound for other requests; fix these first.", hc.n-len(hc.top))
			}
			out = append(out, f)
		}
	}
	if bi.truncated[w] {
		out = append(out, Finding{ID: IDNotChecked, Severity: SeverityInfo,
			What: fmt.Sprintf("The timeout budget (%s) was computed for the first %d requests the cluster's rules name; some of this webhook's were past that bound.", IDTimeoutBudget, bi.limit),
			Why:  "Doctor bounds the work of one run; the budget of the requests left out is unknown.",
			Fix:  fmt.Sprintf("kadmit doctor %s  # the budget is computed over all configurations either way; narrow the rules that list many resources", w.Configuration)})
	}
	return out
}

// budgetFinding renders case c for webhook w.
func budgetFinding(w *Webhook, c *budgetCase) Finding {
	var parts []string
	for i, h := range c.hooks {
		if i == maxBudgetListed-1 && len(c.hooks) > maxBudgetListed {
			parts = append(parts, fmt.Sprintf("and %d more", len(c.hooks)-i))
			break
		}
		kind := "validating"
		if h.Kind == KindMutating {
			kind = "mutating"
		}
		t := fmt.Sprintf("%ds", h.TimeoutSeconds)
		if multiplier(h) == 2 {
			t = fmt.Sprintf("%ds, reinvocationPolicy IfNeeded: 2x%ds", 2*h.TimeoutSeconds, h.TimeoutSeconds)
		}
		parts = append(parts, fmt.Sprintf("%s %s of %s (%s)", kind, h.Name, h.Configuration, t))
	}
	var reqs []string
	for _, q := range c.reqs {
		reqs = append(reqs, q.String())
	}
	what := strings.Join(reqs, ", ")
	if c.nreqs > len(c.reqs) {
		what += fmt.Sprintf(" and %d more", c.nreqs-len(c.reqs))
	}
	where := ""
	if c.namespace != "" {
		where = fmt.Sprintf(" in namespace %s (where their namespaceSelectors all select)", c.namespace)
	}
	valNote := ""
	if c.validating > 0 {
		valNote = fmt.Sprintf(" (validating webhooks run in parallel: only the slowest, %ds, counts)", c.validating)
	}
	f := Finding{ID: IDTimeoutBudget, Severity: SeverityWarning,
		What: fmt.Sprintf("%s%s can wait up to %ds for %d webhooks, above %s: %s%s.",
			what, where, c.total, len(c.hooks), c.bounds[0].who, strings.Join(parts, "; "), valNote),
		Why: fmt.Sprintf("The API server calls the mutating webhooks one after another (an IfNeeded one again when a later one changed the object) and then the validating ones in parallel, each waiting up to its timeoutSeconds (k8s.io/apiserver v0.37.1 admission/plugin/webhook/mutating/dispatcher.go, validating/dispatcher.go, admission/reinvocation.go). When they are slow or unreachable together (an overloaded node, a NetworkPolicy dropping the API server, a rollout), %s.",
			c.bounds[0].why),
		Fix: budgetFix(w, c),
	}
	if len(c.bounds) > 1 {
		f.Why += fmt.Sprintf(" It is also above %s: %s.", c.bounds[1].who, c.bounds[1].why)
	}
	if len(c.unsure) > 0 {
		f.What = cannotTell(f.What, c.unsure)
	}
	return f
}

// budgetFix is the patch of one webhook's timeoutSeconds that brings c
// to its tightest bound: w's own when lowering w alone can, else the one
// of another listed webhook that can (a validating webhook that is not
// the slowest never can: they run in parallel), else w's as far as it
// goes, saying how much more the others must give.
func budgetFix(w *Webhook, c *budgetCase) string {
	limit := int(c.bounds[0].limit / time.Second)
	excess := c.total - limit
	patch := func(h *Webhook, t int) string {
		return jsonPatchCommand(h, []map[string]any{{"op": "replace", "path": fmt.Sprintf("/webhooks/%d/timeoutSeconds", h.Index), "value": t}})
	}
	// lower is the timeoutSeconds h needs for the whole excess and the
	// worst case after it; ok is false when h alone cannot (it then gives
	// the most it can: 1s).
	lower := func(h *Webhook) (t, total int, ok bool) {
		ht := int(h.TimeoutSeconds)
		if h.Kind == KindMutating {
			m := multiplier(h)
			t = ht - int(math.Ceil(float64(excess)/float64(m)))
			ok = t >= 1
			t = max(t, 1)
			return t, c.total - (ht-t)*m, ok
		}
		if ht < c.validating {
			return ht, c.total, false // not the slowest: nothing changes
		}
		second := 0
		for _, o := range c.hooks {
			if o.Kind == KindValidating && o != h {
				second = max(second, int(o.TimeoutSeconds))
			}
		}
		t = max(1, ht-excess)
		total = c.total - ht + max(t, second)
		return t, total, total <= limit
	}
	t, total, ok := lower(w)
	if ok {
		return fmt.Sprintf("%s  # brings the worst case to %ds", patch(w, t), total)
	}
	var own string
	switch {
	case w.Kind == KindValidating && int(w.TimeoutSeconds) < c.validating:
		own = fmt.Sprintf("lowering this webhook's timeoutSeconds does not help: validating webhooks run in parallel and only the slowest (%ds) counts", c.validating)
	default:
		own = fmt.Sprintf("this webhook alone cannot bring it below %ds (at most to %ds, with %s)", limit, total, patch(w, t))
	}
	var best *Webhook
	bestT, bestTotal := 0, 0
	for _, h := range c.hooks {
		if h == w {
			continue
		}
		if ht, htotal, hok := lower(h); hok && (best == nil || h.TimeoutSeconds > best.TimeoutSeconds) {
			best, bestT, bestTotal = h, ht, htotal
		}
	}
	if best != nil {
		return fmt.Sprintf("%s  # %s of %s: brings the worst case to %ds; %s", patch(best, bestT), best.Name, best.Configuration, bestTotal, own)
	}
	return fmt.Sprintf("Lower several of the listed webhooks' timeoutSeconds by %ds in all (each mutating second counts, twice with IfNeeded; of the validating ones only the slowest): %s", excess, own)
}
