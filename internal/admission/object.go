package admission

// ObjectField returns obj[key] as a JSON object, storing a new empty one
// there when it is absent, null or not an object. Mutators edit the object
// decoded into map[string]any rather than a typed struct, so that fields
// kadmit's API types do not know survive the round trip; this is how they
// reach into it.
func ObjectField(obj map[string]any, key string) map[string]any {
	m, _ := obj[key].(map[string]any)
	if m == nil {
		m = map[string]any{}
		obj[key] = m
	}
	return m
}
