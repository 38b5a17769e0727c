package metrics

import "github.com/prometheus/client_golang/prometheus"

// DecodeBudgetSource reports the declared policies' decode budget
// (celpolicy.Budget): bytes held now, its size, and refusals so far.
type DecodeBudgetSource struct {
	Used, Refused func() int64
	Max           int64
}

// NewDecodeBudget registers on reg, without labels:
//   - kadmit_policy_decoded_bytes: estimated bytes of the objects declared
//     policies hold decoded now; kadmit_policy_decoded_bytes_limit
//     (--policy-decode-bytes-in-flight).
//   - kadmit_policy_decode_refused_total: declared-policy reviews answered
//     503 because that budget was spent.
//
// It returns an error when a metric is already registered on reg.
func NewDecodeBudget(reg prometheus.Registerer, src DecodeBudgetSource) error {
	return register(reg,
		gauge("kadmit_policy_decoded_bytes", "Estimated bytes of the objects declared policies hold decoded now.", src.Used),
		gauge("kadmit_policy_decoded_bytes_limit", "Bound on kadmit_policy_decoded_bytes (--policy-decode-bytes-in-flight).", constant(src.Max)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kadmit_policy_decode_refused_total", Help: "Declared-policy reviews answered 503 because the decoded-objects budget was spent."},
			func() float64 { return float64(src.Refused()) }),
	)
}
