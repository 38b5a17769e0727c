package readiness

import (
	"errors"
	"testing"
)

func TestGateReportsFirstFailure(t *testing.T) {
	var calls []string
	cond := func(name string, err error) Condition {
		return Condition{Name: name, Check: func() error { calls = append(calls, name); return err }}
	}
	boom := errors.New("not synced")
	g := Gate{cond("listener", nil), {Name: "skipped"}, cond("caches", boom), cond("never", errors.New("x"))}
	err := g.Check()
	if !errors.Is(err, boom) || err.Error() != "caches: not synced" {
		t.Fatalf("Check = %v, want caches: not synced", err)
	}
	if len(calls) != 2 {
		t.Fatalf("conditions checked %v, want to stop at the first failure", calls)
	}
	if err := (Gate{cond("a", nil)}).Check(); err != nil {
		t.Fatalf("all holding: %v", err)
	}
}

func TestGateDegradedDoesNotGate(t *testing.T) {
	boom := errors.New("declared set does not compile")
	g := Gate{{Name: "certificate", Check: func() error { return nil }}, {Name: "declaredPolicies", Check: func() error { return boom }, Degraded: true}}
	if err := g.Check(); err != nil {
		t.Fatalf("Check = %v: a degraded condition must not make the replica unready", err)
	}
	if err := g.Degraded(); !errors.Is(err, boom) || err.Error() != "declaredPolicies: declared set does not compile" {
		t.Fatalf("Degraded = %v", err)
	}
	g[1].Check = func() error { return nil }
	if err := g.Degraded(); err != nil {
		t.Fatalf("Degraded with all holding = %v", err)
	}
}
