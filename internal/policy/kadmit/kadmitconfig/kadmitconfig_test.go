package kadmitconfig_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kadmit/kadmit/internal/admission"
	"github.com/kadmit/kadmit/internal/builtin"
	"github.com/kadmit/kadmit/internal/policy/kadmit/kadmitconfig"
	"github.com/kadmit/kadmit/internal/testkit"
)

func load(cm *corev1.ConfigMap, key string) error {
	_, err := builtin.Config.FromConfigMap(cm, key)
	return err
}

func cmReq(op admissionv1.Operation, ns, name string, data map[string]string) *admission.Request {
	raw, _ := json.Marshal(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data})
	return testkit.Request(op, testkit.ConfigMaps, raw, nil, testkit.Namespace(ns), testkit.Name(name))
}

const bad = "apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  lifespan: {max: -1}\n"

func TestValidate(t *testing.T) {
	cfg := kadmitconfig.DefaultConfig()
	cfg.Namespace, cfg.Name = "kadmit-config", "kadmit"
	p, err := kadmitconfig.New(cfg, load)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	good := "apiVersion: kadmit.io/v1alpha1\nkind: Configuration\npolicies:\n  lifespan: {max: 7}\n"
	if v := p.Validate(ctx, cmReq(admissionv1.Update, "kadmit-config", "kadmit", map[string]string{"config.yaml": good})); !v.Allowed {
		t.Fatalf("good config denied: %+v", v)
	}
	v := p.Validate(ctx, cmReq(admissionv1.Update, "kadmit-config", "kadmit", map[string]string{"config.yaml": bad}))
	if v.Allowed || v.Code != 403 {
		t.Fatalf("bad config: %+v", v)
	}
	// The message is the error serve prints for the same text in a file,
	// with the ConfigMap in place of the file name.
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	_, fileErr := builtin.Config.LoadFile(file)
	wantTail := strings.TrimPrefix(fileErr.Error(), file+": ")
	if want := "ConfigMap kadmit-config/kadmit data[config.yaml]: " + wantTail; v.Message != want {
		t.Fatalf("message %q, want %q", v.Message, want)
	}
	if !strings.Contains(v.Message, "policies.lifespan.max") {
		t.Fatalf("message does not name the field: %q", v.Message)
	}
	if v := p.Validate(ctx, cmReq(admissionv1.Create, "kadmit-config", "kadmit", map[string]string{"other": good})); v.Allowed ||
		!strings.Contains(v.Message, "data[config.yaml]: invalid kadmit configuration: the key is missing") {
		t.Fatalf("missing key: %+v", v)
	}
	// Other ConfigMaps are not kadmit's business.
	for _, r := range []*admission.Request{
		cmReq(admissionv1.Update, "kadmit-config", "other", map[string]string{"config.yaml": bad}),
		cmReq(admissionv1.Update, "elsewhere", "kadmit", map[string]string{"config.yaml": bad}),
	} {
		if v := p.Validate(ctx, r); !v.Allowed {
			t.Fatalf("unrelated ConfigMap denied: %+v", v)
		}
	}
}

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg     kadmitconfig.Config
		enabled bool
		want    string
	}{
		{kadmitconfig.DefaultConfig(), false, ""},
		{kadmitconfig.Config{Key: "config.yaml"}, true, `namespace: ""`},
		{kadmitconfig.Config{Namespace: "kube-system", Name: "k", Key: "config.yaml"}, false, "namespace: kube-system is excluded"},
		{kadmitconfig.Config{Namespace: "a", Name: "B_", Key: "config.yaml"}, false, `name: "B_"`},
		{kadmitconfig.Config{Namespace: "a", Name: "b", Key: "a/b"}, false, `key: "a/b"`},
	} {
		err := tc.cfg.Validate()
		if err == nil && tc.enabled {
			err = tc.cfg.ValidateEnabled()
		}
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)) {
			t.Errorf("%+v: Validate() = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := kadmitconfig.New(kadmitconfig.DefaultConfig(), nil); err == nil {
		t.Error("New without a loader succeeded")
	}
	p, _ := kadmitconfig.New(kadmitconfig.Config{Namespace: "a", Name: "b", Key: "k"}, load)
	hs := p.Hooks()
	if len(hs) != 1 || hs[0].Path != "/validate-configmap" || hs[0].FailurePolicy != "Fail" || hs[0].Rules[0].Resources[0] != "configmaps" {
		t.Fatalf("hooks %+v", hs)
	}
}
