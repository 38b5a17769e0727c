// Package webhookcerts runs the TLS lifecycle of an admission (or CRD
// conversion) webhook server inside the cluster: one CA and serving
// certificate kept in a Secret, served from memory, rotated with overlap,
// injected as caBundle into the webhook configurations it owns, and a
// readiness check that passes only when the API server can verify the
// served chain.
//
// It depends on client-go and apimachinery only; the controller-runtime
// glue (Add) is in the subpackage crmanager, so a binary that does not use
// controller-runtime does not link it.
package webhookcerts
