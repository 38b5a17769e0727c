package sloconfig

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kadmit/kadmit/internal/quantity"
)

// The network QoS check of resource-qos-config, ported from
// pkg/webhook/cm/plugins/sloconfig/resource_qos_checker.go (v1.8.0):
// CheckNetQosCfg (:80-98) and the functions it calls. Quantity strings are
// parsed with quantity.Parse (bounded cost; a magnitude of 2^63 milli-units
// or more is refused) where upstream calls resource.ParseQuantity.

// invalidPercentageValueMsg is upstream's InvalidPercentageValueMsg (:40),
// stray quote included.
const invalidPercentageValueMsg = `must be percentage value just in 0-100'`

func checkNetQOS(cfg *ResourceQOSCfg, sys *SystemCfg) error {
	if cfg == nil || sys == nil {
		return nil
	}
	if err := checkEachElement(cfg, field.NewPath("ResourceQOSCfg")); err != nil {
		return err
	}
	if err := checkOnlyOneFormat(cfg); err != nil {
		return err
	}
	if err := checkTotalPercentage(cfg); err != nil {
		return err
	}
	return checkTotalQuantity(cfg, sys)
}

func classes(s *ResourceQOSStrategy) []struct {
	name string
	qos  *ResourceQOS
} {
	return []struct {
		name string
		qos  *ResourceQOS
	}{{"LSRClass", s.LSRClass}, {"LSClass", s.LSClass}, {"BEClass", s.BEClass}}
}

// checkEachElement is CheckEachElementIsValid (:100-141).
func checkEachElement(cfg *ResourceQOSCfg, path *field.Path) error {
	do := func(path *field.Path, s *ResourceQOSStrategy) error {
		if s == nil {
			return nil
		}
		for _, c := range classes(s) {
			if c.qos == nil {
				continue
			}
			if err := checkSubNetQOS(path.Child(c.name), c.qos.NetworkQOS); err != nil {
				return err
			}
		}
		return nil
	}
	if cfg.ClusterStrategy != nil {
		if err := do(path.Child("ClusterStrategy"), cfg.ClusterStrategy); err != nil {
			return err
		}
	}
	for i, n := range cfg.NodeStrategies {
		if err := do(path.Child("nodeStrategy").Child(strconv.Itoa(i)), n.ResourceQOSStrategy); err != nil {
			return err
		}
	}
	return nil
}

// checkSubNetQOS is CheckSubNetQos (:306-325); upstream wraps the list in
// storage.NewInvalidError, whose text is the list's aggregate.
func checkSubNetQOS(path *field.Path, q *NetworkQOSCfg) error {
	if q == nil {
		return nil
	}
	for _, f := range []struct {
		name string
		v    *intstr.IntOrString
	}{{"IngressRequest", q.IngressRequest}, {"IngressLimit", q.IngressLimit}, {"EgressRequest", q.EgressRequest}, {"EgressLimit", q.EgressLimit}} {
		if errs := validatePercentageOrQuantity(f.v, path.Child(f.name)); len(errs) > 0 {
			return errs.ToAggregate()
		}
	}
	return nil
}

// validatePercentageOrQuantity is ValidatePercentageOrQuantity (:329-345).
func validatePercentageOrQuantity(v *intstr.IntOrString, path *field.Path) field.ErrorList {
	if v == nil {
		return nil
	}
	switch v.Type {
	case intstr.String:
		if _, err := quantity.Parse(v.StrVal); err != nil {
			return field.ErrorList{field.Invalid(path, v.StrVal, err.Error())}
		}
	case intstr.Int:
		if n := v.IntValue(); n < 0 || n > 100 {
			return field.ErrorList{field.Invalid(path, n, invalidPercentageValueMsg)}
		}
	default:
		return field.ErrorList{field.Invalid(path, v, "must be an integer just in 0-100 or quantity (e.g '50M')")}
	}
	return nil
}

// subtract is doSubstration (:165-214): total minus every class's ingress
// and egress request (an integer as is, a quantity string by its value;
// one that does not parse is skipped).
func subtract(s *ResourceQOSStrategy, total int64) (ingress, egress int64) {
	ingress, egress = total, total
	if s == nil {
		return
	}
	value := func(r *intstr.IntOrString) int64 {
		if r == nil {
			return 0
		}
		switch r.Type {
		case intstr.Int:
			return int64(r.IntValue())
		case intstr.String:
			if q, err := quantity.Parse(r.StrVal); err == nil {
				return q.Value()
			}
		}
		return 0
	}
	for _, c := range classes(s) {
		if c.qos == nil || c.qos.NetworkQOS == nil {
			continue
		}
		ingress = subSat(ingress, value(c.qos.NetworkQOS.IngressRequest))
		egress = subSat(egress, value(c.qos.NetworkQOS.EgressRequest))
	}
	return
}

// subSat is a - b, saturating instead of wrapping (upstream wraps, so three
// requests near 2^63 could wrap back to a positive remainder).
func subSat(a, b int64) int64 {
	d := a - b
	if (b > 0 && d > a) || (b < 0 && d < a) {
		if b > 0 {
			return -1 << 63
		}
		return 1<<63 - 1
	}
	return d
}

// checkTotalPercentage is CheckTotalPercentageIsValid (:143-163).
func checkTotalPercentage(cfg *ResourceQOSCfg) error {
	if cfg.ClusterStrategy != nil {
		if in, eg := subtract(cfg.ClusterStrategy, 100); in < 0 || eg < 0 {
			return errors.New("ClusterStrategy total net bandwidth percentage already over 100")
		}
	}
	for i, n := range cfg.NodeStrategies {
		if in, eg := subtract(n.ResourceQOSStrategy, 100); in < 0 || eg < 0 {
			return fmt.Errorf("cfg.NodeStrategies[%d] total net bandwidth percentage already over 100", i)
		}
	}
	return nil
}

// checkTotalQuantity is CheckTotalQuantityIsValid (:216-236) with
// getTotalNetBandWidth (:238-255).
func checkTotalQuantity(cfg *ResourceQOSCfg, sys *SystemCfg) error {
	if cfg.ClusterStrategy != nil && sys.ClusterStrategy != nil {
		if in, eg := subtract(cfg.ClusterStrategy, sys.ClusterStrategy.TotalNetworkBandwidth.Value()); in < 0 || eg < 0 {
			return errors.New("total net bandwidth over total network bandwidth in clusterStrategy")
		}
	}
	for i, n := range cfg.NodeStrategies {
		total := totalBandwidth(n.NodeSelector, sys)
		if in, eg := subtract(n.ResourceQOSStrategy, total); in < 0 || eg < 0 {
			return fmt.Errorf("total net bandwidth quantity already over total network bandwidth in cfg.NodeStrategies[%d]", i)
		}
	}
	return nil
}

func totalBandwidth(sel *metav1.LabelSelector, sys *SystemCfg) int64 {
	if sys == nil {
		return 0
	}
	if len(sys.NodeStrategies) == 0 && sys.ClusterStrategy != nil {
		return sys.ClusterStrategy.TotalNetworkBandwidth.Value()
	}
	for _, s := range sys.NodeStrategies {
		if reflect.DeepEqual(sel, s.NodeSelector) {
			if s.SystemStrategy == nil {
				// Upstream dereferences the nil embedded strategy
				// (a panic); a node strategy without fields has no
				// bandwidth.
				return 0
			}
			return s.TotalNetworkBandwidth.Value()
		}
	}
	return 0
}

// checkOnlyOneFormat is CheckOnlyOneFormat (:257-304): within one strategy,
// the classes' ingress and egress requests are all integers or all
// quantity strings.
func checkOnlyOneFormat(cfg *ResourceQOSCfg) error {
	formats := func(s *ResourceQOSStrategy) int {
		types := map[intstr.Type]bool{}
		if s == nil {
			return 0
		}
		for _, c := range classes(s) {
			if c.qos == nil || c.qos.NetworkQOS == nil {
				continue
			}
			for _, r := range []*intstr.IntOrString{c.qos.NetworkQOS.IngressRequest, c.qos.NetworkQOS.EgressRequest} {
				if r != nil {
					types[r.Type] = true
				}
			}
		}
		return len(types)
	}
	if cfg.ClusterStrategy != nil && formats(cfg.ClusterStrategy) > 1 {
		return errors.New("only one type can be used for percentages or quantity in clusterStrategy")
	}
	for i, n := range cfg.NodeStrategies {
		if formats(n.ResourceQOSStrategy) > 1 {
			return fmt.Errorf("only one type can be used for percentages or quantity in nodeStrategy[%d]", i)
		}
	}
	return nil
}
