package lifecycle

import "github.com/kadmit/kadmit/internal/admission"

// SetHooks replaces the hooks the leader registers (after a configuration
// reload) and makes it re-apply the webhook configurations.
func (m *Manager) SetHooks(hooks []admission.Hook) {
	m.mu.Lock()
	m.o.Hooks = hooks
	m.mu.Unlock()
	m.trigger()
}

func (m *Manager) hooks() []admission.Hook {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.o.Hooks
}
