package celpolicy

import (
	"maps"
	"slices"

	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/types"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
)

// fieldSet is the set of top-level members of object and oldObject a
// validating policy's expressions can read; nil means the whole object.
// A validating policy only reads the object (the dispatcher and CEL never
// change it), so the members nobody reads need not be decoded: for a pod
// checked on its name that is all of spec and status, most of its bytes.
type fieldSet map[string]bool

// alwaysDecoded are the members decoded whatever the expressions read:
// apiVersion and kind (the decoder requires kind, as
// unstructured.UnstructuredJSONScheme does) and metadata, which the API
// server's matcher reads for objectSelector (policy/matching, v0.37.1:
// predicates/object.Matcher reads the labels of object and oldObject).
var alwaysDecoded = []string{"apiVersion", "kind", "metadata"}

// validatingFields returns the top-level members of object and oldObject
// that p's expressions (variables, matchConditions, validations, their
// messageExpressions and auditAnnotations) read, or nil when an
// expression may read the whole object: it uses object or oldObject other
// than to select one member by a constant name (object.spec, has(object.spec),
// object.?spec, object["spec"], object[?"spec"]), or an expression does not
// parse (the evaluator reports that itself). Expressions are parsed, not
// type-checked, with the parser of the environment they are compiled in.
func validatingFields(p *admissionregistrationv1.ValidatingAdmissionPolicy) fieldSet {
	var exprs []string
	for _, v := range p.Spec.Variables {
		exprs = append(exprs, v.Expression)
	}
	for _, m := range p.Spec.MatchConditions {
		exprs = append(exprs, m.Expression)
	}
	for _, v := range p.Spec.Validations {
		exprs = append(exprs, v.Expression)
		if v.MessageExpression != "" {
			exprs = append(exprs, v.MessageExpression)
		}
	}
	for _, a := range p.Spec.AuditAnnotations {
		exprs = append(exprs, a.ValueExpression)
	}
	return exprFields(exprs)
}

// exprFields is validatingFields for a list of expressions.
func exprFields(exprs []string) fieldSet {
	env := compositionEnv().StoredExpressionsEnv()
	fs := fieldSet{}
	for _, m := range alwaysDecoded {
		fs[m] = true
	}
	for _, src := range exprs {
		a, iss := env.Parse(src)
		if iss.Err() != nil {
			return nil
		}
		if !addFields(fs, a.NativeRep().Expr()) {
			return nil
		}
	}
	return fs
}

// addFields adds to fs the members e selects from object or oldObject; it
// returns false when e uses either otherwise.
func addFields(fs fieldSet, e celast.Expr) bool {
	uses := map[int64]bool{}     // ids of object / oldObject identifiers
	selected := map[int64]bool{} // those of them a member selection consumes
	celast.PreOrderVisit(e, celast.NewExprVisitor(func(x celast.Expr) {
		switch x.Kind() {
		case celast.IdentKind:
			if isObjectVar(x) {
				uses[x.ID()] = true
			}
		case celast.SelectKind:
			if op := x.AsSelect().Operand(); isObjectVar(op) {
				fs[x.AsSelect().FieldName()] = true
				selected[op.ID()] = true
			}
		case celast.CallKind:
			c := x.AsCall()
			switch c.FunctionName() {
			case operators.OptSelect, operators.Index, operators.OptIndex:
				if args := c.Args(); len(args) == 2 && isObjectVar(args[0]) && args[1].Kind() == celast.LiteralKind {
					if s, ok := args[1].AsLiteral().(types.String); ok {
						fs[string(s)] = true
						selected[args[0].ID()] = true
					}
				}
			}
		}
	}))
	for id := range uses {
		if !selected[id] {
			return false
		}
	}
	return true
}

func isObjectVar(x celast.Expr) bool {
	if x.Kind() != celast.IdentKind {
		return false
	}
	n := x.AsIdent()
	return n == "object" || n == "oldObject"
}

// union returns the members any of sets reads, nil when one is nil.
func union(sets ...fieldSet) fieldSet {
	out := fieldSet{}
	for _, s := range sets {
		if s == nil {
			return nil
		}
		maps.Copy(out, s)
	}
	return out
}

// names returns the members in order (for tests and logs).
func (fs fieldSet) names() []string { return slices.Sorted(maps.Keys(fs)) }
