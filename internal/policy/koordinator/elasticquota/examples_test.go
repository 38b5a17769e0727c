package elasticquota

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/yaml"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/policy/policytest"
)

// TestQuotaExamples keeps examples/scheduling/quota honest: each manifest's
// first line says "Allowed" or "Denied (400): <message>", and the policy
// with upstream's defaults, offline as `kadmit review` runs it, agrees.
func TestQuotaExamples(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "..", "examples", "scheduling", "quota")
	p, err := New(DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	olds := map[string]string{} // name -> JSON
	for _, d := range []string{"old", "pods-old"} {
		for _, f := range files(t, filepath.Join(dir, d)) {
			for _, doc := range strings.Split(f.text, "\n---\n") {
				j, name := toJSON(t, doc)
				olds[name] = j
			}
		}
	}
	ctx := context.Background()
	for _, sub := range []string{"create", "update", "pods"} {
		for _, f := range files(t, filepath.Join(dir, sub)) {
			t.Run(sub+"/"+f.name, func(t *testing.T) {
				j, name := toJSON(t, f.text)
				var v admission.Verdict
				switch sub {
				case "create":
					out, mv := policytest.Mutate(t, p, qreq(admissionv1.Create, j, ""))
					if v = mv; v.Allowed {
						if out != nil {
							j = string(out)
						}
						v = p.Validate(ctx, qreq(admissionv1.Create, j, ""))
					}
				case "update":
					v = p.Validate(ctx, qreq(admissionv1.Update, j, olds[name]))
				case "pods":
					r := qreq(admissionv1.Update, j, olds[name])
					v = p.ValidatePod(ctx, r)
				}
				header, _, _ := strings.Cut(f.text, "\n")
				if msg, denied := strings.CutPrefix(header, "# Denied (400): "); denied {
					verdict(t, v, msg)
				} else if strings.HasPrefix(header, "# Allowed") {
					verdict(t, v, "")
				} else {
					t.Fatalf("header %q says neither Allowed nor Denied (400): ...", header)
				}
			})
		}
	}
}

type exampleFile struct{ name, text string }

func files(t *testing.T, dir string) []exampleFile {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []exampleFile
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, exampleFile{e.Name(), string(b)})
	}
	if len(out) == 0 {
		t.Fatalf("no examples in %s", dir)
	}
	return out
}

func toJSON(t *testing.T, doc string) (string, string) {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		Metadata struct{ Name string } `json:"metadata"`
	}
	if err := yaml.Unmarshal(j, &meta); err != nil {
		t.Fatal(err)
	}
	return string(j), meta.Metadata.Name
}
