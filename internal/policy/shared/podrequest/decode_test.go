package podrequest

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestDecodeSpecMatchesTypedDecode: for an ordinary spec, Effective over
// DecodeSpec's partial spec equals Effective over the full typed decode.
func TestDecodeSpecMatchesTypedDecode(t *testing.T) {
	raw := `{"containers":[{"name":"a","image":"i","resources":{"requests":{"cpu":"500m"},"limits":{"memory":"1Gi"}}},{"name":"b","resources":{"limits":{"cpu":1}}}],
	"initContainers":[{"name":"s","restartPolicy":"Always","resources":{"requests":{"cpu":"100m"}}},{"name":"i","resources":{"requests":{"cpu":"2","memory":"64Mi"}}}],
	"overhead":{"cpu":"10m"},"volumes":[{"name":"v","emptyDir":{"sizeLimit":"1Gi"}}]}`
	var typed corev1.PodSpec
	if err := json.Unmarshal([]byte(raw), &typed); err != nil {
		t.Fatal(err)
	}
	got, err := DecodeSpec([]byte(raw), "spec")
	if err != nil {
		t.Fatal(err)
	}
	want, have := Effective(&typed), Effective(got)
	if len(want) != len(have) {
		t.Fatalf("Effective = %v, want %v", have, want)
	}
	for name, q := range want {
		if h := have[name]; h.Cmp(q) != 0 {
			t.Errorf("%s = %s, want %s", name, h.String(), q.String())
		}
	}
}

// TestDecodeSpecMatchesKeysAsTheAPIServer: member names match
// case-sensitively (jsonedit.Unmarshal), as the API server decodes the pod
// it admits: a "Containers" or "Requests" member is not the field, so the
// pod asks for nothing (encoding/json would have counted 2 CPUs).
func TestDecodeSpecMatchesKeysAsTheAPIServer(t *testing.T) {
	for _, raw := range []string{
		`{"Containers":[{"name":"a","resources":{"requests":{"cpu":"2"}}}]}`,
		`{"containers":[{"name":"a","Resources":{"requests":{"cpu":"2"}}}]}`,
		`{"containers":[{"name":"a","resources":{"Requests":{"cpu":"2"}}}]}`,
	} {
		got, err := DecodeSpec([]byte(raw), "spec")
		if err != nil {
			t.Fatal(err)
		}
		if r := Effective(got); !r.Cpu().IsZero() {
			t.Errorf("%s: cpu %s, want none", raw, r.Cpu())
		}
	}
}

func TestDecodeSpecNamesField(t *testing.T) {
	for raw, want := range map[string]string{
		`{"containers":[{"name":"a"},{"name":"b","resources":{"requests":{"cpu":"1e9999999"}}}]}`: "spec.containers[1].resources.requests.cpu: quantity 1e9999999 is out of range",
		`{"overhead":{"memory":"1E-9999999"}}`:                                                    "spec.overhead.memory: quantity 1E-9999999 is out of range",
		`{"resources":{"requests":{"cpu":"` + strings.Repeat("9", 10000) + `"}}}`:                 "spec.resources.requests.cpu: quantity",
		`{"containers":{}}`: "spec: json: cannot unmarshal object",
	} {
		_, err := DecodeSpec([]byte(raw), "spec")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.60s: err = %v, want %q", raw, err, want)
		}
	}
}

// TestScaleExact: the largest accepted quantity times a large parallelism
// is exact, not wrapped around int64.
func TestScaleExact(t *testing.T) {
	got := Scale(corev1.ResourceList{"cpu": resource.MustParse("9223372036854775806m")}, 1<<31-1)
	want := resource.MustParse("19807040619342712357236244482m")
	if q := got["cpu"]; q.Sign() <= 0 || q.Cmp(want) != 0 {
		t.Fatalf("Scale = %s, want %s", q.String(), want.String())
	}
}
