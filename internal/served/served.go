// Package served assembles what kadmit serves: the built-in policies the
// registry (package builtin) builds from a configuration and the declared
// policies (package celpolicy), through one function, Assemble, that
// `kadmit serve`, `kadmit review` and `kadmit test` all call; and, from the
// same declarations, the chart's RBAC for the cluster caches they read
// (ChartCachesTemplate, `make generate`). It sits above builtin, config
// and celpolicy, so that the registry does not carry the CEL engine into
// everything that only parses a configuration.
package served

import (
	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/celpolicy"
	"github.com/kadmit/kadmit/internal/clustercache"
	"github.com/kadmit/kadmit/internal/config"
	"github.com/kadmit/kadmit/internal/policy"
)

// Sources is what kadmit is asked to serve: the built-in policies a
// configuration enables and the declared policies (ValidatingAdmissionPolicy
// and MutatingAdmissionPolicy documents). `kadmit serve` (at start and at
// every reload), `kadmit review` and `kadmit test` all hand theirs to
// Assemble, the one place the two kinds are put together.
type Sources struct {
	// Config enables and configures the built-in policies; nil serves none
	// (`kadmit test`, which tests declared policies only).
	Config *config.Configuration
	// Declared, when set, are the declared policies, served after the
	// built-in ones. An empty Declared (no paths, no documents) serves no
	// policy but still lists the caches declared policies read, so a
	// server whose declared set does not load yet keeps the caches the set
	// will need.
	Declared *Declared
	// Env is what the built-in policies get besides the cluster caches
	// (Log, PoliciesConfigMap, LoadConfig: see policy.Env); its Cluster is
	// replaced by the caches Cluster returns.
	Env policy.Env
	// Cluster, when set, is asked once for the cluster caches the sources
	// read (Sources.Caches) before any policy is built, even when there are
	// none: `kadmit serve` starts informers against the API server,
	// `kadmit review --state` fills them from manifests. Nil, or a nil
	// *clustercache.Caches returned, is offline: built-in policies that
	// read cluster state skip those checks with a warning, and declared
	// policies see every namespace with only its kubernetes.io/metadata.name
	// label.
	Cluster func(reads []clustercache.Read) (*clustercache.Caches, error)
}

// Declared are declared policies as celpolicy loads them: the files and
// directories Paths (read at each Assemble) and the in-memory documents
// Docs (a --policies-configmap's data keys), loaded as one set with Load,
// compiled with Options.
type Declared struct {
	Paths []string
	Docs  []celpolicy.Document
	Load  celpolicy.LoadOptions
	// Options bound what the served hooks decode (Budget, MaxObjectBytes)
	// and default mutated objects (Defaulter); Namespaces is set from the
	// cluster caches (celpolicy.Options.WithCluster).
	Options celpolicy.Options
}

// Policies is what Assemble built.
type Policies struct {
	// Hooks are the built-in policies' hooks in registry order, then the
	// declared policies' (celpolicy.Engine.Hooks order).
	Hooks []admission.Hook
	// Caches are the cluster caches the sources read (Sources.Caches), and
	// Cluster what Sources.Cluster returned for them (nil offline).
	Caches  []clustercache.Read
	Cluster *clustercache.Caches
	// Engine evaluates the declared policies (`kadmit test` evaluates it
	// directly, as the API server's in-tree plugins would); nil without
	// Sources.Declared.
	Engine *celpolicy.Engine
}

// DeclaredError is an Assemble error of the declared policies (loading or
// compiling them), as opposed to one of the built-in policies or of the
// cluster caches: `kadmit serve` keeps serving the built-in policies when
// only the declared set fails. Its message is Err's.
type DeclaredError struct{ Err error }

func (e *DeclaredError) Error() string { return e.Err.Error() }
func (e *DeclaredError) Unwrap() error { return e.Err }

// Caches lists the cluster caches s reads: the enabled built-in policies'
// (builtin.Caches) and, with Declared, the declared policies' (celpolicy.Caches:
// namespaces). The chart's RBAC for them is generated from this list
// (chartrbac.go, `make generate`).
func (s Sources) Caches() []clustercache.Read {
	var out []clustercache.Read
	if s.Config != nil {
		out = builtin.Caches(s.Config)
	}
	if s.Declared != nil {
		// Declared policies' namespaceSelector and namespaceObject read
		// namespaces, as the API server's plugins do from its informer.
		out = append(out, celpolicy.Caches()...)
	}
	return out
}

// Assemble builds what kadmit serves from s: it asks s.Cluster for the
// caches s reads, builds the enabled built-in policies with them
// (builtin.Hooks), then loads and compiles the declared policies (celpolicy.LoadWith,
// celpolicy.New) with the same caches. Errors: s.Cluster's, as returned;
// a built-in policy's, naming it ("policy NAME: ..."); the declared
// policies', as a *DeclaredError wrapping celpolicy's (ErrInput for the
// documents). Nothing is returned with an error; caches s.Cluster started
// are the caller's to stop.
func Assemble(s Sources) (*Policies, error) {
	out := &Policies{Caches: s.Caches()}
	if s.Cluster != nil {
		var err error
		if out.Cluster, err = s.Cluster(out.Caches); err != nil {
			return nil, err
		}
	}
	if s.Config != nil {
		env := s.Env
		env.Cluster = out.Cluster
		hooks, err := builtin.Hooks(s.Config, env)
		if err != nil {
			return nil, err
		}
		out.Hooks = hooks
	}
	if d := s.Declared; d != nil {
		set, err := celpolicy.LoadWith(d.Load, d.Paths, d.Docs)
		if err != nil {
			return nil, &DeclaredError{err}
		}
		if out.Engine, err = celpolicy.New(set, d.Options.WithCluster(out.Cluster)); err != nil {
			return nil, &DeclaredError{err}
		}
		out.Hooks = append(out.Hooks, out.Engine.Hooks()...)
	}
	return out, nil
}

// Webhooks groups the hooks by path (admission.NewWebhooks): built-in
// paths first, then the declared policies' (celpolicy.ValidatePath,
// celpolicy.MutatePath).
func (s *Policies) Webhooks() ([]*admission.Webhook, error) {
	return admission.NewWebhooks(s.Hooks)
}
