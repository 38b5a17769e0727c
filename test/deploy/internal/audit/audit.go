// Package audit reads a kube-apiserver JSON audit log and compares the
// calls one (impersonated) user made with the RBAC rules it was given, so a
// test can say "every call was allowed and every granted verb was used".
package audit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Event is the part of an audit.k8s.io/v1 Event this package reads.
type Event struct {
	AuditID          string `json:"auditID"`
	Stage            string `json:"stage"`
	Verb             string `json:"verb"`
	RequestURI       string `json:"requestURI"`
	ImpersonatedUser *struct {
		Username string `json:"username"`
	} `json:"impersonatedUser"`
	User struct {
		Username string `json:"username"`
	} `json:"user"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		APIGroup    string `json:"apiGroup"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	Annotations map[string]string `json:"annotations"`
}

// Call is one authorization-relevant request: what RBAC checked.
type Call struct {
	Group, Resource, Verb, Namespace, Name string
	Allowed                                bool
}

func (c Call) String() string {
	g := c.Group
	if g == "" {
		g = "core"
	}
	s := fmt.Sprintf("%s %s/%s", c.Verb, g, c.Resource)
	if c.Namespace != "" {
		s += " ns=" + c.Namespace
	}
	if c.Name != "" {
		s += " name=" + c.Name
	}
	if !c.Allowed {
		s += " FORBIDDEN"
	}
	return s
}

// Calls reads the log at path and returns the distinct calls made by user
// (the impersonated username, e.g. system:serviceaccount:ns:sa) with a
// User-Agent starting with agent (kadmit's own clients, not a test's
// probes as the same user), and the
// non-resource URLs it requested (discovery, granted to every
// authenticated user by default).
//
// A server-side apply that creates its object is a patch for the audit log
// but is also authorized as a create of that name, so a patch answered 201
// adds a named create.
func Calls(path, user, agent string) ([]Call, []string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	seen := map[Call]bool{}
	nonResource := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, nil, fmt.Errorf("audit: %w", err)
		}
		if e.ImpersonatedUser == nil || e.ImpersonatedUser.Username != user || !strings.HasPrefix(e.UserAgent, agent) {
			continue
		}
		if e.Stage != "ResponseComplete" && e.Stage != "ResponseStarted" && e.Stage != "Panic" {
			continue
		}
		allowed := e.Annotations["authorization.k8s.io/decision"] == "allow"
		if e.ObjectRef == nil || e.ObjectRef.Resource == "" {
			p := e.RequestURI
			if i := strings.IndexByte(p, '?'); i >= 0 {
				p = p[:i]
			}
			nonResource[e.Verb+" "+p] = true
			continue
		}
		res := e.ObjectRef.Resource
		if e.ObjectRef.Subresource != "" {
			res += "/" + e.ObjectRef.Subresource
		}
		c := Call{Group: e.ObjectRef.APIGroup, Resource: res, Verb: e.Verb, Namespace: e.ObjectRef.Namespace, Name: e.ObjectRef.Name, Allowed: allowed}
		seen[c] = true
		if e.Verb == "patch" && e.ResponseStatus != nil && e.ResponseStatus.Code == 201 {
			c.Verb = "create"
			seen[c] = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, err
	}
	var out []Call
	for c := range seen {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out, slices.Sorted(maps.Keys(nonResource)), nil
}

// Grant is one atom of an RBAC rule: a verb on a resource, by name or not,
// in a namespace (Role) or anywhere (ClusterRole).
type Grant struct {
	Role                  string // Kind/name of the role it comes from
	Group, Resource, Verb string
	Namespace             string // "" for a ClusterRole
	Name                  string // "" when the rule has no resourceNames
}

func (g Grant) String() string {
	gr := g.Group
	if gr == "" {
		gr = "core"
	}
	s := fmt.Sprintf("%s %s/%s", g.Verb, gr, g.Resource)
	if g.Name != "" {
		s += " name=" + g.Name
	}
	return s + " (" + g.Role + ")"
}

// Grants expands Role and ClusterRole objects into atoms.
func Grants(roles ...*unstructured.Unstructured) ([]Grant, error) {
	var out []Grant
	for _, r := range roles {
		rules, _, err := unstructured.NestedSlice(r.Object, "rules")
		if err != nil {
			return nil, err
		}
		ns := ""
		if r.GetKind() == "Role" {
			ns = r.GetNamespace()
		}
		for _, raw := range rules {
			rule := raw.(map[string]any)
			strs := func(k string) []string {
				v, _, _ := unstructured.NestedStringSlice(rule, k)
				return v
			}
			names := strs("resourceNames")
			if len(names) == 0 {
				names = []string{""}
			}
			for _, g := range strs("apiGroups") {
				for _, res := range strs("resources") {
					for _, v := range strs("verbs") {
						for _, n := range names {
							out = append(out, Grant{Role: r.GetKind() + "/" + r.GetName(), Group: g, Resource: res, Verb: v, Namespace: ns, Name: n})
						}
					}
				}
			}
		}
	}
	return out, nil
}

// Covers reports whether g authorizes c.
func (g Grant) Covers(c Call) bool {
	if g.Group != c.Group || g.Resource != c.Resource || g.Verb != c.Verb {
		return false
	}
	if g.Namespace != "" && g.Namespace != c.Namespace {
		return false
	}
	return g.Name == "" || g.Name == c.Name
}

// Compare returns the calls no grant covers (or that were forbidden) and the
// grants no allowed call used.
func Compare(calls []Call, grants []Grant) (uncovered []Call, unused []Grant) {
	for _, c := range calls {
		covered := false
		for _, g := range grants {
			if g.Covers(c) {
				covered = true
				break
			}
		}
		if !covered || !c.Allowed {
			uncovered = append(uncovered, c)
		}
	}
	for _, g := range grants {
		used := false
		for _, c := range calls {
			if c.Allowed && g.Covers(c) {
				used = true
				break
			}
		}
		if !used {
			unused = append(unused, g)
		}
	}
	return uncovered, unused
}

// saPrefix is how the API server names a ServiceAccount's user
// (k8s.io/apiserver/pkg/authentication/serviceaccount.MakeUsername).
const saPrefix = "system:serviceaccount:"

// subjectUser names an RBAC subject as the authorizer sees it: a
// ServiceAccount as system:serviceaccount:<ns>:<name>, a User by its name.
// Groups have no single user; they come back as "group:<name>".
func subjectUser(s map[string]any, bindingNS string) string {
	kind, _ := s["kind"].(string)
	name, _ := s["name"].(string)
	switch kind {
	case "ServiceAccount":
		ns, _ := s["namespace"].(string)
		if ns == "" {
			ns = bindingNS
		}
		return saPrefix + ns + ":" + name
	case "Group":
		return "group:" + name
	default:
		return name
	}
}

// roleKey names a role as a binding's roleRef resolves it: a Role by its
// namespace (the binding's own) and name, a ClusterRole by name.
func roleKey(kind, ns, name string) string {
	if kind == "ClusterRole" {
		return "ClusterRole/" + name
	}
	return "Role/" + ns + "/" + name
}

// BoundGrants returns the grants the RoleBindings and ClusterRoleBindings
// among objs give user, expanded from the Roles and ClusterRoles among objs
// they reference, as RBAC authorizes (k8s.io/kubernetes
// pkg/registry/rbac/validation/rule.go, VisitRulesFor): a ClusterRoleBinding
// grants its ClusterRole cluster-wide, a RoleBinding grants its Role or
// ClusterRole in the binding's namespace only. A role no binding gives
// user grants user nothing, however broad it is.
//
// A binding whose roleRef names a role absent from objs is an error: its
// grants cannot be read from objs (CheckBindings says why it is wrong).
func BoundGrants(user string, objs ...*unstructured.Unstructured) ([]Grant, error) {
	roles := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		if k := o.GetKind(); k == "Role" || k == "ClusterRole" {
			roles[roleKey(k, o.GetNamespace(), o.GetName())] = o
		}
	}
	var out []Grant
	for _, b := range objs {
		kind := b.GetKind()
		if kind != "RoleBinding" && kind != "ClusterRoleBinding" {
			continue
		}
		subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
		binds := false
		for _, s := range subjects {
			if m, ok := s.(map[string]any); ok && subjectUser(m, b.GetNamespace()) == user {
				binds = true
			}
		}
		if !binds {
			continue
		}
		refKind, _, _ := unstructured.NestedString(b.Object, "roleRef", "kind")
		refName, _, _ := unstructured.NestedString(b.Object, "roleRef", "name")
		role := roles[roleKey(refKind, b.GetNamespace(), refName)]
		if role == nil {
			return nil, fmt.Errorf("audit: %s/%s binds %s to %s %q, which objs do not hold", kind, b.GetName(), user, refKind, refName)
		}
		gs, err := Grants(role)
		if err != nil {
			return nil, err
		}
		for _, g := range gs {
			if kind == "RoleBinding" {
				// a RoleBinding confines even a ClusterRole to its namespace
				g.Namespace = b.GetNamespace()
			}
			out = append(out, g)
		}
	}
	return out, nil
}

// CheckBindings returns what is wrong with the RBAC among objs, one
// sentence each, for a chart that must grant only its own roles to its own
// ServiceAccounts:
//   - every RoleBinding and ClusterRoleBinding references a Role or
//     ClusterRole objs hold (a RoleBinding's Role in its own namespace);
//   - every subject is a ServiceAccount objs hold;
//   - every Role and ClusterRole is bound, unless unbound names it (by
//     Kind/name) with the reason it is left for users to bind.
func CheckBindings(objs []*unstructured.Unstructured, unbound map[string]string) []string {
	roles := map[string]bool{}
	sas := map[string]bool{}
	for _, o := range objs {
		switch k := o.GetKind(); k {
		case "Role", "ClusterRole":
			roles[roleKey(k, o.GetNamespace(), o.GetName())] = false
		case "ServiceAccount":
			sas[saPrefix+o.GetNamespace()+":"+o.GetName()] = true
		}
	}
	var problems []string
	for _, b := range objs {
		kind := b.GetKind()
		if kind != "RoleBinding" && kind != "ClusterRoleBinding" {
			continue
		}
		refGroup, _, _ := unstructured.NestedString(b.Object, "roleRef", "apiGroup")
		refKind, _, _ := unstructured.NestedString(b.Object, "roleRef", "kind")
		refName, _, _ := unstructured.NestedString(b.Object, "roleRef", "name")
		key := roleKey(refKind, b.GetNamespace(), refName)
		if seen, ok := roles[key]; refGroup != "rbac.authorization.k8s.io" || !ok || (kind == "ClusterRoleBinding" && refKind != "ClusterRole") {
			problems = append(problems, fmt.Sprintf("%s/%s references %s/%s %q, which the chart does not render", kind, b.GetName(), refGroup, refKind, refName))
		} else if !seen {
			roles[key] = true
		}
		subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
		if len(subjects) == 0 {
			problems = append(problems, fmt.Sprintf("%s/%s has no subjects", kind, b.GetName()))
		}
		for _, s := range subjects {
			m, _ := s.(map[string]any)
			if u := subjectUser(m, b.GetNamespace()); m["kind"] != "ServiceAccount" || !sas[u] {
				problems = append(problems, fmt.Sprintf("%s/%s binds %v, not a ServiceAccount the chart renders", kind, b.GetName(), m))
			}
		}
	}
	keys := slices.Sorted(maps.Keys(roles))
	for _, k := range keys {
		if roles[k] {
			continue
		}
		name := k
		if strings.HasPrefix(k, "Role/") {
			name = "Role/" + k[strings.LastIndexByte(k, '/')+1:]
		}
		if _, ok := unbound[name]; !ok {
			problems = append(problems, fmt.Sprintf("%s is rendered but bound to nobody", name))
		}
	}
	return problems
}
