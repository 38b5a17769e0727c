package colocation

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestConfigErrors(t *testing.T) {
	bad := intstr.FromString("half")
	for _, c := range []struct {
		p    Profile
		want string
	}{
		{Profile{Name: "Bad"}, "profiles[0].name"},
		{Profile{Name: "a", QoSClass: "GOLD"}, `profiles[0].qosClass: "GOLD": must be one of LSE, LSR, LS, BE, SYSTEM`},
		{Profile{Name: "a", Probability: &bad}, "profiles[0].probability"},
		{Profile{Name: "a", LabelKeysMapping: map[string]string{"a": "b c"}}, "profiles[0].labelKeysMapping[a]"},
		{Profile{Name: "a", LabelSuffixes: map[string]string{"a b": "x"}}, "profiles[0].labelSuffixes"},
		{Profile{Name: "a", Labels: map[string]string{"a": "not valid!"}}, "profiles[0].labels[a]"},
		{Profile{Name: "a", Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Bogus"}}}}, "profiles[0].selector"},
		{Profile{Name: "a", PriorityClassName: "Not_DNS"}, "profiles[0].priorityClassName"},
		{Profile{Name: "a", Tolerations: []corev1.Toleration{{Key: "k", Operator: "Maybe"}}}, "profiles[0].tolerations[0]"},
	} {
		err := Config{Profiles: []Profile{c.p}}.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.p, err, c.want)
		}
	}
	if err := (Config{Profiles: []Profile{{Name: "a"}, {Name: "a"}}}).Validate(); err == nil || !strings.Contains(err.Error(), "duplicate") {
		t.Errorf("duplicate: %v", err)
	}
	good := intstr.FromString("50%")
	if err := (Config{Profiles: []Profile{{Name: "a", Probability: &good, QoSClass: "BE", KoordinatorPriority: p32(-1)}}}).Validate(); err != nil {
		t.Errorf("valid profile: %v", err)
	}
}
