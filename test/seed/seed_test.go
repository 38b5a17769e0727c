package seed

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// dir is examples/seed of this repository (test/seed -> ../../examples/seed).
var dir = filepath.Join("..", "..", "examples", "seed")

// TestManifestsDecodeStrictly loads every seed manifest the table uses, so
// that a renamed file or a misspelt field fails without an API server.
func TestManifestsDecodeStrictly(t *testing.T) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]any{
		"offensive-pod.yaml": &corev1.Pod{}, "lifespan-three.yaml": &corev1.Pod{}, "plain-pod.yaml": &corev1.Pod{},
		"node.yaml": &corev1.Node{}, "node-status.yaml": &corev1.Node{}, "bad-ratio-node.yaml": &corev1.Node{},
	}
	for name, into := range kinds {
		if err := Load(dir, name, into); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, en := range entries {
		if _, ok := kinds[en.Name()]; !ok && strings.HasSuffix(en.Name(), ".yaml") {
			t.Errorf("examples/seed/%s is in no scenario of the table", en.Name())
		}
	}
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "p.yaml"), []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containerz: []}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Load(bad, "p.yaml", &corev1.Pod{}); err == nil || !strings.Contains(err.Error(), "containerz") {
		t.Errorf("Load of a misspelt field = %v; want an error naming it", err)
	}
}

// TestScenariosFailWithoutKadmit runs the table against a fake clientset,
// which stores everything as sent: no scenario may pass there, or it would
// not prove anything about kadmit.
func TestScenariosFailWithoutKadmit(t *testing.T) {
	var created []string
	e := &Env{Client: fake.NewClientset(), Dir: dir, Namespace: "ns", NodeSuffix: "run1",
		Created: func(kind, ns, name string) { created = append(created, kind+" "+ns+"/"+name) }}
	names := map[string]bool{}
	for _, sc := range Scenarios() {
		if names[sc.Name] {
			t.Errorf("two scenarios named %q", sc.Name)
		}
		names[sc.Name] = true
		r := sc.Run(context.Background(), e)
		if r.Matched() || r.Got == "" {
			t.Errorf("%s: matched without kadmit (got %q)", sc.Name, r.Got)
		}
	}
	for _, c := range created {
		if strings.HasPrefix(c, "Node ") && !strings.HasSuffix(c, "-run1") {
			t.Errorf("node %q created without the run's suffix", c)
		}
	}
	if len(created) == 0 {
		t.Error("Created was never called")
	}
}
