// Package podname implements the pod-name policy: it denies pods whose name
// contains a configured word, so that offensive or reserved words never show up
// in kubectl output, logs and metrics labels derived from pod names.
package podname

import (
	"context"
	"errors"
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/kadmit/kadmit/internal/admission"
)

// Name is the policy's name in the configuration (policies.pod-name) and in
// the webhook registration (pod-name.kadmit.io).
const Name = "pod-name"

// Path is the URL path of the validating hook.
const Path = "/validate-pod"

// Config is the pod-name policy's configuration (policies.pod-name).
type Config struct {
	// Words are the forbidden substrings: non-empty list of non-empty strings.
	// The first one found in the name is reported.
	Words []string `json:"words"`
	// CaseInsensitive makes "Offensive" match the word "offensive". Off by
	// default because Kubernetes names are lowercase DNS labels anyway, and
	// exact matching is what an operator reading the list expects.
	CaseInsensitive bool `json:"caseInsensitive"`
}

// DefaultConfig is the seed profile: enabled, words ["offensive"],
// case-sensitive, failurePolicy Fail.
func DefaultConfig() Config {
	return Config{Words: []string{"offensive"}}
}

// Validate reports the first problem in c as "<field>: <problem>", e.g.
// `words[1]: must not be empty`; the field path is relative to the policy
// so the config loader can prefix "policies.pod-name.".
func (c Config) Validate() error {
	if len(c.Words) == 0 {
		return errors.New("words: must list at least one word")
	}
	for i, w := range c.Words {
		// An empty word is a substring of every name: it would deny all pods.
		if w == "" {
			return fmt.Errorf("words[%d]: must not be empty", i)
		}
	}
	return nil
}

// Policy denies pods on CREATE whose metadata.name (or metadata.generateName
// when the name is empty) contains one of the configured words.
type Policy struct {
	cfg Config
	// folded holds the words lowercased when matching is case-insensitive,
	// so Validate does not lowercase them on every request.
	folded []string
}

// New validates cfg and builds the policy; it returns Config.Validate's error
// unchanged so the caller can prefix the field path.
func New(cfg Config) (*Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Words = append([]string(nil), cfg.Words...)
	p := &Policy{cfg: cfg, folded: cfg.Words}
	if cfg.CaseInsensitive {
		p.folded = make([]string, len(cfg.Words))
		for i, w := range cfg.Words {
			p.folded[i] = strings.ToLower(w)
		}
	}
	return p, nil
}

// Hooks returns the policy's single validating hook: POST /validate-pod for
// core/v1 pods on CREATE, failurePolicy Fail unless configured otherwise.
// Names are immutable, so UPDATE needs no check.
func (p *Policy) Hooks() []admission.Hook {
	fp := admissionregistrationv1.Fail
	return []admission.Hook{{
		Policy: Name,
		Path:   Path,
		Type:   admission.Validating,
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule: admissionregistrationv1.Rule{
				APIGroups:   []string{""},
				APIVersions: []string{"v1"},
				Resources:   []string{"pods"},
			},
		}},
		FailurePolicy: fp,
		Validator:     p,
	}}
}

// Validate denies (403) with `pod name contains "<word>"` when the pod's name
// contains a configured word; it answers 400 when the object is not a pod JSON.
func (p *Policy) Validate(_ context.Context, req *admission.Request) admission.Verdict {
	var pod podNames
	if _, err := req.DecodeObjectFields(podNamesKeep, &pod); err != nil {
		return admission.Invalid("%s: cannot parse the pod: %v", Name, err)
	}
	// generateName is what the user chose when the API server picks the
	// suffix; on CREATE the name is still empty then.
	name := pod.Metadata.Name
	if name == "" {
		name = pod.Metadata.GenerateName
	}
	if w, ok := p.match(name); ok {
		return admission.Deny("pod name contains %q", w)
	}
	return admission.Allow()
}

// podNames is the part of a pod Validate reads. Decoding only it (not a
// corev1.Pod) was most of the validating path's cost: a 4.6 KB pod's spec is
// never looked at. Field types are corev1.ObjectMeta's, so a wrongly typed
// name is still a 400.
type podNames struct {
	Metadata struct {
		Name         string `json:"name"`
		GenerateName string `json:"generateName"`
	} `json:"metadata"`
}

var podNamesKeep = admission.Keep{"metadata": {"name": nil, "generateName": nil}}

// match returns the configured word found in name, if any.
func (p *Policy) match(name string) (string, bool) {
	if p.cfg.CaseInsensitive {
		name = strings.ToLower(name)
	}
	for i, w := range p.folded {
		if strings.Contains(name, w) {
			return p.cfg.Words[i], true
		}
	}
	return "", false
}

// BoundedReview marks the policy admission.Bounded, so its hooks run on
// the request's goroutine: it reads the object it is given and nothing else.
func (*Policy) BoundedReview() {}
