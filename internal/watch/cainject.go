package watch

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/kadmit/kadmit/pkg/webhookcerts"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kadmit/kadmit/internal/doctor"
)

// IDInjectMismatch is the watch's own check: a configuration cert-manager's
// cainjector injects into holds a caBundle without the CA of the Secret
// it injects from (or that Secret is missing). It is not in doctor.Checks:
// only the watch reads Secrets, and only where the annotation asks.
const IDInjectMismatch = "KD411"

// cert-manager's cainjector annotations (cert-manager
// pkg/apis/certmanager/v1/types.go: WantInjectAnnotation,
// WantInjectFromSecretAnnotation) and the Secret key it copies into
// caBundle (pkg/apis/meta/v1 TLSCAKey, read by the Certificate and Secret
// data sources of pkg/controller/cainjector/sources.go).
const (
	annInjectFrom       = "cert-manager.io/inject-ca-from"
	annInjectFromSecret = "cert-manager.io/inject-ca-from-secret"
	secretCAKey         = "ca.crt"
)

var certificateGVR = schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "certificates"}

// injectSource is the Secret a configuration's caBundle is injected from.
type injectSource struct {
	namespace, secret string
	via               string // "Certificate ns/name" or "Secret ns/name"
	gap               *doctor.AccessGap
	missing           string // why the Secret cannot be found, when it cannot
	cas               []*x509.Certificate
}

// injector checks cert-manager injection sources. It reads the Secret
// named by the annotation (or the Certificate's spec.secretName) with one
// targeted GET per source and round, only for configurations that carry
// the annotation; a refused read is a KD001 info finding. A mismatch must
// be seen in two consecutive rounds (HandshakeInterval apart) before it is
// reported: the cainjector updates caBundle seconds after the Secret
// changes, and that window is no fault.
type injector struct {
	c       *Controller
	pending map[wkey]bool // mismatched in the previous round
}

// round reads every source once and returns the findings per webhook.
func (in *injector) round(ctx context.Context) map[wkey][]doctor.Finding {
	out := map[wkey][]doctor.Finding{}
	now := map[wkey]bool{}
	sources := map[string]*injectSource{}
	tracked := in.c.trackedSet()
	check := func(kind, name string, ann map[string]string, hooks []*doctor.Webhook) {
		ref, byCert := ann[annInjectFrom], true
		if ref == "" {
			ref, byCert = ann[annInjectFromSecret], false
		}
		if ref == "" {
			return
		}
		src := sources[fmt.Sprint(byCert, ref)]
		if src == nil {
			src = in.read(ctx, ref, byCert)
			sources[fmt.Sprint(byCert, ref)] = src
		}
		for _, w := range hooks {
			k := keyOf(w)
			if tracked[k] == nil {
				continue
			}
			switch {
			case src.gap != nil:
				out[k] = append(out[k], src.gap.Finding())
			case src.missing != "" || !bundleHolds(w.ClientConfig.CABundle, src.cas):
				now[k] = true
				if in.pending[k] {
					out[k] = append(out[k], mismatchFinding(w, src))
				}
			}
		}
	}
	if ms, err := in.c.cl.mutating.List(labels.Everything()); err == nil {
		sort.Slice(ms, func(a, b int) bool { return ms[a].Name < ms[b].Name })
		for _, m := range ms {
			check(doctor.KindMutating, m.Name, m.Annotations, doctor.FromMutating(m))
		}
	}
	if vs, err := in.c.cl.validating.List(labels.Everything()); err == nil {
		sort.Slice(vs, func(a, b int) bool { return vs[a].Name < vs[b].Name })
		for _, v := range vs {
			check(doctor.KindValidating, v.Name, v.Annotations, doctor.FromValidating(v))
		}
	}
	in.pending = now
	return out
}

// read resolves ref ("namespace/name") to the Secret's CA certificates.
func (in *injector) read(ctx context.Context, ref string, byCert bool) *injectSource {
	ns, name, ok := strings.Cut(ref, "/")
	src := &injectSource{namespace: ns, secret: name, via: "Secret " + ref}
	if !ok || ns == "" || name == "" {
		src.missing = fmt.Sprintf("the annotation's value %q is not <namespace>/<name>", ref)
		return src
	}
	if byCert {
		src.via = "Certificate " + ref
		if in.c.o.Dynamic == nil {
			src.gap = &doctor.AccessGap{Verb: "get", Resource: "certificates.cert-manager.io", Namespace: ns, Reason: "not served",
				Lost: "which Secret Certificate " + ref + " writes, so whether caBundle holds its CA (" + IDInjectMismatch + ")"}
			return src
		}
		u, err := in.c.o.Dynamic.Resource(certificateGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsForbidden(err) || apierrors.IsMethodNotSupported(err) || (apierrors.IsNotFound(err) && !isObjectNotFound(err)):
			src.gap = gapFor("get", "certificates.cert-manager.io", ns, err, "which Secret Certificate "+ref+" writes, so whether caBundle holds its CA ("+IDInjectMismatch+")")
			return src
		case apierrors.IsNotFound(err):
			src.missing = "Certificate " + ref + " does not exist"
			return src
		case err != nil:
			src.gap = &doctor.AccessGap{Verb: "get", Resource: "certificates.cert-manager.io", Namespace: ns, Reason: "failed: " + err.Error(), Lost: "whether caBundle holds the CA of Certificate " + ref}
			return src
		}
		secret, _, _ := unstructured.NestedString(u.Object, "spec", "secretName")
		if secret == "" {
			src.missing = "Certificate " + ref + " has no spec.secretName"
			return src
		}
		src.secret = secret
	}
	s, err := in.c.o.Client.CoreV1().Secrets(ns).Get(ctx, src.secret, metav1.GetOptions{})
	switch {
	case apierrors.IsForbidden(err):
		src.gap = gapFor("get", "secrets", ns, err, "whether caBundle holds the CA of Secret "+ns+"/"+src.secret+" that cert-manager injects from ("+IDInjectMismatch+"); grant get on that Secret to check it")
	case apierrors.IsNotFound(err):
		src.missing = "Secret " + ns + "/" + src.secret + " (from " + src.via + ") does not exist"
	case err != nil:
		src.gap = &doctor.AccessGap{Verb: "get", Resource: "secrets", Namespace: ns, Reason: "failed: " + err.Error(), Lost: "whether caBundle holds the CA of Secret " + ns + "/" + src.secret}
	default:
		cas, perr := webhookcerts.ParseCertificates(s.Data[secretCAKey])
		if perr != nil || len(cas) == 0 {
			src.missing = "Secret " + ns + "/" + src.secret + " holds no parsable " + secretCAKey
		}
		src.cas = cas
	}
	return src
}

// isObjectNotFound tells a missing object (a NotFound naming it) from a
// resource the API server does not serve (cert-manager not installed).
func isObjectNotFound(err error) bool {
	var se apierrors.APIStatus
	if !apierrors.IsNotFound(err) || !errors.As(err, &se) {
		return false
	}
	d := se.Status().Details
	return d != nil && d.Name != ""
}

func gapFor(verb, resource, ns string, err error, lost string) *doctor.AccessGap {
	g := &doctor.AccessGap{Verb: verb, Resource: resource, Namespace: ns, Reason: "forbidden", Lost: lost}
	if !apierrors.IsForbidden(err) {
		g.Reason = "not served"
	}
	return g
}

// bundleHolds reports whether every CA is in the PEM bundle.
func bundleHolds(bundle []byte, cas []*x509.Certificate) bool {
	have, err := webhookcerts.ParseCertificates(bundle)
	if err != nil {
		return false
	}
	for _, ca := range cas {
		found := false
		for _, h := range have {
			if h.Equal(ca) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func mismatchFinding(w *doctor.Webhook, src *injectSource) doctor.Finding {
	what := fmt.Sprintf("clientConfig.caBundle does not hold the CA in %s of Secret %s/%s, which cert-manager's cainjector injects from (%s).", secretCAKey, src.namespace, src.secret, src.via)
	if src.missing != "" {
		what = fmt.Sprintf("cert-manager's cainjector is asked to inject from %s, but %s.", src.via, src.missing)
	}
	return doctor.Finding{ID: IDInjectMismatch, Severity: doctor.SeverityWarning, What: what,
		Why: "The cainjector keeps caBundle equal to the Secret's CA; a difference lasting two rounds means it is not running, not allowed to update the configuration, or the annotation points at the wrong object. Once serving certificates come from the Secret's CA, calls fail with \"x509: certificate signed by unknown authority\".",
		Fix: fmt.Sprintf("kubectl -n cert-manager logs deploy/cert-manager-cainjector; kubectl -n %s get secret %s -o jsonpath='{.data.ca\\.crt}' | base64 -d | openssl x509 -noout -subject -enddate  # compare with the caBundle of webhook %s", src.namespace, src.secret, w.Name),
	}
}
