package celpolicy

import (
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/interpreter"
)

// An evaluation whose review was abandoned at its deadline must stop, or
// it keeps a CPU and the request's memory long after the answer. The API
// server's compiler already builds every program with
// cel.InterruptCheckFrequency(celconfig.CheckFrequency) and evaluates with
// the request's context (k8s.io/apiserver v0.37.1 pkg/admission/plugin/
// cel/compile.go CompileCELExpression, activation.go ForInput), and kadmit
// compiles with that compiler and dispatches with the review's context: a
// comprehension (all, exists, map, filter) checks the context every 100
// iterations. But cel-go checks only comprehensions, and a few library
// functions loop for as long as a quadratic in their lists' sizes in one
// Go call, charging their cost only once they return (cel-go v0.29.2
// ext/lists.go distinctList, ext/sets.go setsContains, setsEquivalent,
// setsIntersects): `list.distinct()` over 40,000 environment variables
// ran for 9.5 CPU-seconds after its review's 500.
//
// interruptibleCalls replaces those calls, at program planning, with the
// same algorithm (same results, same order, same cost charged by the same
// cost trackers, which observe the call by its overload id and arguments)
// that asks the evaluation frame whether its context ended as it goes
// (ExecutionFrame.CheckInterrupt, which reads the context every
// InterruptCheckFrequency calls). An interrupted call returns cel-go's
// InterruptError, as an interrupted comprehension does.
func interruptibleCalls(i interpreter.InterpretableV2) (interpreter.InterpretableV2, error) {
	call, ok := i.(interpreter.InterpretableCall)
	if !ok {
		return i, nil
	}
	var impl func(f *interpreter.ExecutionFrame, args []ref.Val) ref.Val
	switch call.OverloadID() {
	case "list_distinct":
		impl = distinctInterruptible
	case "list_sets_contains_list":
		impl = func(f *interpreter.ExecutionFrame, a []ref.Val) ref.Val {
			return setsContainsInterruptible(f, a[0], a[1])
		}
	case "list_sets_equivalent_list":
		impl = func(f *interpreter.ExecutionFrame, a []ref.Val) ref.Val {
			if r := setsContainsInterruptible(f, a[0], a[1]); r != types.True {
				return r
			}
			return setsContainsInterruptible(f, a[1], a[0])
		}
	case "list_sets_intersects_list":
		impl = setsIntersectsInterruptible
	default:
		return i, nil
	}
	return &interruptibleCall{InterpretableCall: call, impl: impl}, nil
}

// interruptibleCall evaluates its arguments as the call it replaces does
// (strictly: an error or unknown argument is the result) and runs impl on
// lists, or the original call on anything else.
type interruptibleCall struct {
	interpreter.InterpretableCall
	impl func(f *interpreter.ExecutionFrame, args []ref.Val) ref.Val
}

func (c *interruptibleCall) Eval(vars interpreter.Activation) ref.Val {
	return c.Exec(interpreter.AsFrame(vars))
}

func (c *interruptibleCall) Exec(f *interpreter.ExecutionFrame) ref.Val {
	args := c.Args()
	vals := make([]ref.Val, len(args))
	for i, a := range args {
		v := a.Exec(f)
		if types.IsUnknownOrError(v) {
			return v
		}
		if _, ok := v.(traits.Lister); !ok {
			return c.InterpretableCall.Exec(f)
		}
		vals[i] = v
	}
	return c.impl(f, vals)
}

func interrupted() ref.Val { return types.WrapErr(interpreter.InterruptError{}) }

// distinctInterruptible is cel-go v0.29.2 ext/lists.go distinctList with
// an interrupt check per comparison.
func distinctInterruptible(f *interpreter.ExecutionFrame, args []ref.Val) ref.Val {
	list := args[0].(traits.Lister)
	n := list.Size().(types.Int)
	if n == 0 {
		return list
	}
	unique := make([]ref.Val, 0, n)
	for i := types.IntZero; i < n; i++ {
		val := list.Get(i)
		seen := false
		for j := types.IntZero; j < types.Int(len(unique)); j++ {
			if f.CheckInterrupt() {
				return interrupted()
			}
			if i == j {
				continue
			}
			if val.Equal(unique[j]) == types.True {
				seen = true
				break
			}
		}
		if !seen {
			unique = append(unique, val)
		}
	}
	return types.DefaultTypeAdapter.NativeToValue(unique)
}

// setsContainsInterruptible is ext/sets.go setsContains with an interrupt
// check per element of sub (each Contains is linear).
func setsContainsInterruptible(f *interpreter.ExecutionFrame, list, sub ref.Val) ref.Val {
	l := list.(traits.Lister)
	it := sub.(traits.Lister).Iterator()
	for it.HasNext() == types.True {
		if f.CheckInterrupt() {
			return interrupted()
		}
		if exists := l.Contains(it.Next()); exists != types.True {
			return exists
		}
	}
	return types.True
}

// setsIntersectsInterruptible is ext/sets.go setsIntersects with an
// interrupt check per element of the first list.
func setsIntersectsInterruptible(f *interpreter.ExecutionFrame, args []ref.Val) ref.Val {
	lB := args[1].(traits.Lister)
	it := args[0].(traits.Lister).Iterator()
	for it.HasNext() == types.True {
		if f.CheckInterrupt() {
			return interrupted()
		}
		if lB.Contains(it.Next()) == types.True {
			return types.True
		}
	}
	return types.False
}
