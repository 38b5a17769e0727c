package celpolicy

import "github.com/kadmit/kadmit/internal/admission"

// LoadWebhooks loads the policies at paths (see Load), compiles them (see
// New) and returns their webhooks, for this package's tests. kadmit itself
// builds what it serves in one place, internal/served's Assemble.
func LoadWebhooks(opts Options, paths ...string) ([]*admission.Webhook, *Engine, error) {
	set, err := LoadWith(LoadOptions{}, paths, nil)
	if err != nil {
		return nil, nil, err
	}
	e, err := New(set, opts)
	if err != nil {
		return nil, nil, err
	}
	whs, err := admission.NewWebhooks(e.Hooks())
	if err != nil {
		return nil, nil, err
	}
	return whs, e, nil
}
