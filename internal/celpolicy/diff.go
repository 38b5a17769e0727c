package celpolicy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strconv"

	"github.com/kadmit/kadmit/internal/jsonedit"
)

// A mutating policy's result is a whole object (the API server's patchers
// return the patched object, mutating/patch: ApplyConfiguration merges
// with structured-merge-diff, JSONPatch applies RFC 6902). kadmit answers
// a webhook with JSONPatch operations, and package jsonedit is its one way
// to state them: Ops walks both objects and states each difference with
// jsonedit.Doc.Set/Remove. Objects recurse member by member, arrays of
// equal length element by element, an array whose length changed is
// replaced whole (never wrong, if not minimal).

// maxDiffDepth bounds Ops' recursion; deeper differences are replaced whole.
const maxDiffDepth = 64

// Ops returns the JSONPatch operations that turn before into after (both
// JSON objects). Numbers compare by their decimal text.
func Ops(before, after []byte) ([]jsonedit.Op, error) {
	b, err := decodeNumber(before)
	if err != nil {
		return nil, fmt.Errorf("original object: %w", err)
	}
	a, err := decodeNumber(after)
	if err != nil {
		return nil, fmt.Errorf("mutated object: %w", err)
	}
	doc := jsonedit.NewDoc(before)
	if err := diffValue(doc, nil, b, a, 0); err != nil {
		return nil, err
	}
	return doc.Ops(), nil
}

func decodeNumber(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

func jsonChanged(before, after []byte) (bool, error) {
	b, err := decodeNumber(before)
	if err != nil {
		return false, err
	}
	a, err := decodeNumber(after)
	if err != nil {
		return false, err
	}
	return !equalJSON(a, b), nil
}

// equalJSON compares decoded JSON; numbers by value when both parse as
// float64 the same (1 and 1.0 are one number to the API server).
func equalJSON(a, b any) bool {
	switch av := a.(type) {
	case json.Number:
		bv, ok := b.(json.Number)
		if !ok {
			return false
		}
		if av == bv {
			return true
		}
		af, e1 := strconv.ParseFloat(string(av), 64)
		bf, e2 := strconv.ParseFloat(string(bv), 64)
		return e1 == nil && e2 == nil && af == bf
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok || len(av) != len(bv) {
			return false
		}
		for k, x := range av {
			y, ok := bv[k]
			if !ok || !equalJSON(x, y) {
				return false
			}
		}
		return true
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			return false
		}
		for i := range av {
			if !equalJSON(av[i], bv[i]) {
				return false
			}
		}
		return true
	default:
		return reflect.DeepEqual(a, b)
	}
}

func diffValue(doc *jsonedit.Doc, path []string, b, a any, depth int) error {
	if equalJSON(a, b) {
		return nil
	}
	if depth < maxDiffDepth {
		switch av := a.(type) {
		case map[string]any:
			if bv, ok := b.(map[string]any); ok && bv != nil {
				keys := make([]string, 0, len(bv)+len(av))
				for k := range bv {
					if _, ok := av[k]; !ok {
						keys = append(keys, k)
					}
				}
				sort.Strings(keys)
				for _, k := range keys {
					if err := doc.Remove(append(path[:len(path):len(path)], k)...); err != nil {
						return err
					}
				}
				keys = keys[:0]
				for k := range av {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				for _, k := range keys {
					p := append(path[:len(path):len(path)], k)
					old, ok := bv[k]
					if !ok {
						if err := doc.Set(raw(av[k]), p...); err != nil {
							return err
						}
						continue
					}
					if err := diffValue(doc, p, old, av[k], depth+1); err != nil {
						return err
					}
				}
				return nil
			}
		case []any:
			if bv, ok := b.([]any); ok && len(bv) == len(av) && len(path) > 0 {
				for i := range av {
					if err := diffValue(doc, append(path[:len(path):len(path)], strconv.Itoa(i)), bv[i], av[i], depth+1); err != nil {
						return err
					}
				}
				return nil
			}
		}
	}
	if len(path) == 0 {
		return fmt.Errorf("the mutated object is not a JSON object")
	}
	return doc.Set(raw(a), path...)
}

// raw re-encodes a decoded value keeping numbers' text.
func raw(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}
