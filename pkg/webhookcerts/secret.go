package webhookcerts

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// RotateAnnotation is the default Options.RotateAnnotation: on the
// certificate Secret it forces a rotation: "serving"
// re-issues the serving certificate, "ca" starts a CA rotation (which then
// proceeds through its gated steps). The write that performs the step
// removes it; during a CA rotation already under way, "ca" waits for it to
// finish and then starts another.
const RotateAnnotation = "webhookcerts.kadmit.io/rotate"

// Values of RotateAnnotation.
const (
	RotateServing = "serving"
	RotateCA      = "ca"
)

// managedSecretKeys are the Secret data keys the Rotator owns; any other
// key of an adopted Secret is kept.
var managedSecretKeys = []string{SecretCertKey, SecretKeyKey, SecretCAKey, SecretCAPrivateKey, SecretCrossKey}

// maxWrites bounds the read-decide-write rounds of one syncSecret: each
// round either writes one step, or re-reads after another replica's write.
const maxWrites = 8

// step is one decided write of the Secret.
type step struct {
	name        string // for logs: create, restore, fill, adopt-ca, serving, new-ca, reissue-from-new-ca, drop-old-cas
	create      bool
	next        *Material
	clearRotate bool
}

// secretGeneration is the Secret's GenerationAnnotation; 0 for nil or
// none.
func secretGeneration(s *corev1.Secret) int64 {
	if s == nil {
		return 0
	}
	return parseGeneration(s.Annotations)
}

// readSecret returns the certificate Secret, or nil when it does not exist:
// from the informer unless fresh or before the informer synced, else by a
// GET.
func (r *Rotator) readSecret(ctx context.Context, fresh bool) (*corev1.Secret, error) {
	r.mu.Lock()
	store := r.secretStore
	r.mu.Unlock()
	if !fresh && store != nil && r.synced.Load() {
		obj, ok, err := store.GetByKey(r.o.SecretKey.String())
		if err != nil {
			return nil, fmt.Errorf("read Secret %s from cache: %w", r.o.SecretKey, err)
		}
		if !ok {
			// The cache may lag a Create; confirm with the API server.
			return r.readSecret(ctx, true)
		}
		return obj.(*corev1.Secret), nil
	}
	s, err := r.kube.CoreV1().Secrets(r.o.SecretKey.Namespace).Get(ctx, r.o.SecretKey.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get Secret %s: %w", r.o.SecretKey, err)
	}
	return s, nil
}

// syncSecret takes the Secret one or more steps towards what Material.Check
// and RotateAnnotation ask for, coordinating with the other replicas through
// the resourceVersion alone: every write is an Update carrying the
// resourceVersion it read (a Create when the Secret is missing), and a
// Conflict or AlreadyExists means another replica acted, so it re-reads
// from the API server and decides again. Gated steps run only when gated;
// a gate not met is returned as waiting (nil when nothing waits). It
// returns the Secret as last read or written and its material.
func (r *Rotator) syncSecret(ctx context.Context, gated bool) (s *corev1.Secret, mat *Material, waiting error, err error) {
	fresh, have := false, false
	for range maxWrites {
		if !have {
			if s, err = r.readSecret(ctx, fresh); err != nil {
				return nil, nil, nil, err
			}
		}
		var st *step
		st, mat, waiting, err = r.decide(ctx, s, gated)
		if err != nil {
			return nil, nil, nil, err
		}
		if st == nil {
			return s, mat, waiting, nil
		}
		written, err := r.writeSecret(ctx, s, st)
		switch {
		case err == nil:
			r.log.Info("wrote certificate Secret", "secret", r.o.SecretKey.String(), "step", st.name,
				"generation", secretGeneration(written), "bundleCAs", len(st.next.Bundle), "signingCA", st.next.Bundle[0].Subject.CommonName)
			r.observeRotate(st)
			s, have, fresh = written, true, false
		case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
			r.log.V(1).Info("another replica wrote the Secret first; re-reading", "step", st.name, "reason", err.Error())
			have, fresh = false, true
		default:
			return nil, nil, nil, err
		}
	}
	return nil, nil, nil, fmt.Errorf("Secret %s: still changing after %d rounds", r.o.SecretKey, maxWrites)
}

// observeRotate tells the Observer which certificates the written step
// issued: a new CA ("ca") and/or a new serving certificate ("serving").
// Restoring and dropping old CAs issue none.
func (r *Rotator) observeRotate(st *step) {
	if r.o.Observer == nil {
		return
	}
	switch st.name {
	case "create", "fill":
		r.o.Observer.OnRotate(RotateCA)
		r.o.Observer.OnRotate(RotateServing)
	case "new-ca":
		r.o.Observer.OnRotate(RotateCA)
	case "serving", "adopt-ca", string(DueReissueFromNewCA):
		r.o.Observer.OnRotate(RotateServing)
	}
}

// writeSecret performs st on s (nil: create). The write stamps
// GenerationAnnotation: the read generation plus one (for a Create, one
// more than any generation this replica knows, the owned objects'
// included, so a recreated Secret's bundle is never taken for an older
// one).
func (r *Rotator) writeSecret(ctx context.Context, s *corev1.Secret, st *step) (*corev1.Secret, error) {
	secrets := r.kube.CoreV1().Secrets(r.o.SecretKey.Namespace)
	if st.create {
		gen := r.knownGeneration(ctx) + 1
		obj := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name: r.o.SecretKey.Name, Namespace: r.o.SecretKey.Namespace,
				Labels:      map[string]string{"app.kubernetes.io/managed-by": r.o.FieldManager},
				Annotations: map[string]string{GenerationAnnotation: strconv.FormatInt(gen, 10)},
			},
			Type: corev1.SecretTypeTLS,
			Data: st.next.SecretData(),
		}
		out, err := secrets.Create(ctx, obj, metav1.CreateOptions{FieldManager: r.o.FieldManager})
		if err != nil {
			return nil, fmt.Errorf("create Secret %s (%s): %w", r.o.SecretKey, st.name, err)
		}
		return out, nil
	}
	upd := s.DeepCopy()
	data := maps.Clone(upd.Data)
	if data == nil {
		data = map[string][]byte{}
	}
	for _, k := range managedSecretKeys {
		delete(data, k)
	}
	maps.Copy(data, st.next.SecretData())
	upd.Data = data
	if upd.Annotations == nil {
		upd.Annotations = map[string]string{}
	}
	upd.Annotations[GenerationAnnotation] = strconv.FormatInt(secretGeneration(s)+1, 10)
	if st.clearRotate {
		delete(upd.Annotations, r.o.RotateAnnotation)
	}
	// upd carries s's resourceVersion: the API server refuses the Update
	// with a Conflict if another replica wrote in between.
	out, err := secrets.Update(ctx, upd, metav1.UpdateOptions{FieldManager: r.o.FieldManager})
	if err != nil {
		return nil, fmt.Errorf("update Secret %s (%s): %w", r.o.SecretKey, st.name, err)
	}
	return out, nil
}

// raiseGeneration handles an owned object whose GenerationAnnotation is
// above the Secret s's. If the API server's Secret (a GET) is newer than s,
// this replica lags and s is returned as is: inject leaves that object
// alone until the newer Secret arrives. If it is s itself, no Secret of
// that generation exists any more (the Secret was recreated, restored from
// a backup or edited by hand), and no replica would ever inject the object
// again: the Secret's generation is raised above the object's by an Update
// carrying s's resourceVersion (data unchanged), and the written Secret is
// returned. A Conflict means another replica wrote: s is returned, the next
// pass sees the newer Secret.
func (r *Rotator) raiseGeneration(ctx context.Context, s *corev1.Secret, live bool) (*corev1.Secret, error) {
	gen := secretGeneration(s)
	_, top, err := r.inj.Bundles(ctx, live)
	if err != nil {
		return nil, err
	}
	if top <= gen {
		return s, nil
	}
	fresh, err := r.readSecret(ctx, true)
	if err != nil || fresh == nil || fresh.ResourceVersion != s.ResourceVersion {
		return s, err
	}
	upd := fresh.DeepCopy()
	if upd.Annotations == nil {
		upd.Annotations = map[string]string{}
	}
	upd.Annotations[GenerationAnnotation] = strconv.FormatInt(top+1, 10)
	out, err := r.kube.CoreV1().Secrets(r.o.SecretKey.Namespace).Update(ctx, upd, metav1.UpdateOptions{FieldManager: r.o.FieldManager})
	switch {
	case apierrors.IsConflict(err):
		return s, nil
	case err != nil:
		return nil, fmt.Errorf("raise the generation of Secret %s: %w", r.o.SecretKey, err)
	}
	r.log.Info("an owned object carries a generation no Secret has; raised the Secret's above it", "objectGeneration", top, "from", gen, "to", top+1)
	return out, nil
}

// knownGeneration is the highest generation this replica knows: the
// served Secret's and every owned object's (read errors count as 0).
func (r *Rotator) knownGeneration(ctx context.Context) int64 {
	r.mu.Lock()
	g := r.matGen
	r.mu.Unlock()
	if _, top, err := r.inj.Bundles(ctx, false); err == nil {
		g = max(g, top)
	}
	return g
}

// decide returns the step the Secret s (nil: missing) needs now, or nil
// with the material s holds; waiting says which gate holds a step back.
func (r *Rotator) decide(ctx context.Context, s *corev1.Secret, gated bool) (*step, *Material, error, error) {
	now := r.now()
	if s == nil {
		if last := r.served(); last != nil {
			return &step{name: "restore", create: true, next: last}, nil, nil, nil
		}
		m, err := NewMaterial(r.spec, now)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("new certificate material: %w", err)
		}
		return &step{name: "create", create: true, next: m}, nil, nil, nil
	}
	cur, perr := ParseSecretData(s.Data)
	if perr != nil {
		if m := r.adoptCA(s.Data, now); m != nil {
			return &step{name: "adopt-ca", next: m}, nil, nil, nil
		}
		if last := r.served(); last != nil {
			r.log.Info("certificate Secret is unusable; restoring the material this replica serves", "reason", perr.Error())
			return &step{name: "restore", next: last}, nil, nil, nil
		}
		m, err := NewMaterial(r.spec, now)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("new certificate material: %w", err)
		}
		return &step{name: "fill", next: m}, nil, nil, nil
	}

	forced := s.Annotations[r.o.RotateAnnotation]
	if forced != "" && forced != RotateCA && forced != RotateServing {
		r.logOnce("rotate:"+forced, "ignoring unknown rotate annotation value (want ca or serving)", "annotation", r.o.RotateAnnotation, "value", forced)
		forced = ""
	}
	switch due := cur.Check(r.spec, now); {
	case due == DueReissueFromNewCA:
		if !gated {
			return nil, cur, errors.New("re-issuing from the new CA is left to Start"), nil
		}
		next, err := cur.WithServing(r.spec, now)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("re-issue serving certificate from the new CA: %w", err)
		}
		if werr := r.gateReissue(ctx, next); werr != nil {
			return nil, cur, fmt.Errorf("re-issue from the new CA waits: %w", werr), nil
		}
		return &step{name: string(due), next: next, clearRotate: forced == RotateServing}, cur, nil, nil
	case due == DueDropOldCAs:
		if !gated {
			return nil, cur, errors.New("dropping old CAs is left to Start"), nil
		}
		if werr := r.gateDropOld(ctx, cur); werr != nil {
			return nil, cur, fmt.Errorf("dropping old CAs waits: %w", werr), nil
		}
		return &step{name: string(due), next: cur.WithoutOldCAs()}, cur, nil, nil
	case due == DueCA || forced == RotateCA:
		next, err := cur.WithNewCA(r.spec, now)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("new CA: %w", err)
		}
		return &step{name: "new-ca", next: next, clearRotate: forced == RotateCA}, cur, nil, nil
	case due == DueServing || forced == RotateServing:
		next, err := cur.WithServing(r.spec, now)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("re-issue serving certificate: %w", err)
		}
		return &step{name: "serving", next: next, clearRotate: forced == RotateServing}, cur, nil, nil
	}
	return nil, cur, nil, nil
}

// adoptCA keeps the CA of a Secret whose ca.crt and ca.key are usable but
// whose serving pair is not (missing, corrupt, another layout): a serving
// certificate is issued from that CA. This is the upgrade path from
// cert-controller and other tools, and keeps the CA every webhook already
// trusts. It returns nil when ca.crt / ca.key are unusable or the CA has
// expired.
func (r *Rotator) adoptCA(data map[string][]byte, now time.Time) *Material {
	bundle, err := ParseCertificates(data[SecretCAKey])
	if err != nil {
		return nil
	}
	key, err := ParseKey(data[SecretCAPrivateKey])
	if err != nil || !bundle[0].IsCA || !publicKeysEqual(bundle[0].PublicKey, key.Public()) || !now.Before(bundle[0].NotAfter) {
		return nil
	}
	certPEM, keyPEM, err := IssueServing(bundle[0], key, r.spec.DNSNames, r.spec.IPs, now, r.spec.ServingValidity, r.spec.KeyType)
	if err != nil {
		return nil
	}
	d := map[string][]byte{SecretCAKey: data[SecretCAKey], SecretCAPrivateKey: data[SecretCAPrivateKey], SecretCertKey: certPEM, SecretKeyKey: keyPEM}
	if c := data[SecretCrossKey]; len(c) > 0 {
		d[SecretCrossKey] = c
	}
	m, err := ParseSecretData(d)
	if err != nil {
		return nil
	}
	if m.Cross != nil {
		// Serve the cross-signed intermediate too, as WithServing does.
		if m, err = m.WithServing(r.spec, now); err != nil {
			return nil
		}
	}
	r.log.Info("certificate Secret has a usable CA but no usable serving certificate; keeping the CA", "ca", bundle[0].Subject.CommonName)
	return m
}

// startSecretInformer watches the Secret alone (its namespace, field
// selector metadata.name): every change is parsed and served (load) and
// wakes the reconcile loop.
func (r *Rotator) startSecretInformer(ctx context.Context) (cache.SharedIndexInformer, error) {
	f := informers.NewSharedInformerFactoryWithOptions(r.kube, 0,
		informers.WithNamespace(r.o.SecretKey.Namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", r.o.SecretKey.Name).String()
		}))
	inf := f.Core().V1().Secrets().Informer()
	onSecret := func(obj any) {
		if s, ok := obj.(*corev1.Secret); ok && s.Name == r.o.SecretKey.Name {
			r.loadSecret(s)
		}
		r.trigger()
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onSecret,
		UpdateFunc: func(_, obj any) { onSecret(obj) },
		DeleteFunc: func(any) { r.trigger() },
	}); err != nil {
		return nil, fmt.Errorf("Secret %s informer: %w", r.o.SecretKey, err)
	}
	r.mu.Lock()
	r.secretStore = inf.GetStore()
	r.mu.Unlock()
	f.Start(ctx.Done())
	return inf, nil
}

// loadSecret serves the material of s when it parses. An unusable Secret
// keeps the current certificate: serving on is better than failing every
// call while a replica repairs it.
func (r *Rotator) loadSecret(s *corev1.Secret) {
	m, err := ParseSecretData(s.Data)
	if err != nil {
		r.log.Info("certificate Secret is unusable; keeping the served certificate", "secret", r.o.SecretKey.String(), "reason", err.Error())
		if r.o.Observer != nil {
			r.o.Observer.OnError(fmt.Errorf("Secret %s: %w", r.o.SecretKey, err))
		}
		return
	}
	r.load(m, secretGeneration(s))
}
