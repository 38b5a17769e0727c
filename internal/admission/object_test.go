package admission

import "testing"

func TestObjectField(t *testing.T) {
	obj := map[string]any{"spec": map[string]any{"a": 1.0}, "status": nil, "data": "x"}
	if got := ObjectField(obj, "spec"); got["a"] != 1.0 {
		t.Fatalf("existing object not returned: %v", got)
	}
	for _, key := range []string{"metadata", "status", "data"} {
		m := ObjectField(obj, key)
		m["k"] = "v"
		if stored, _ := obj[key].(map[string]any); stored["k"] != "v" {
			t.Fatalf("%s: new object not stored in place: %v", key, obj[key])
		}
	}
}
