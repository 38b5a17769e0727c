package kueuecluster

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kadmit/kadmit/test/cluster"
	"github.com/kadmit/kadmit/test/deploy/realcluster"
)

// probeEvery paces Observe's probe of what each manager pod serves.
const probeEvery = 250 * time.Millisecond

// Observe adds to tl, until the returned stop is called or ctx ends, every
// change of what the certificates look like from outside: the webhook
// Secret (its CAs, and which CA its leaf is from), the caBundle of both
// webhook configurations, and the leaf each manager pod serves on its
// webhook port (probed every probeEvery with a TLS handshake). CAs are
// named by the first bytes of their SubjectKeyId, leaves by the
// AuthorityKeyId that names their CA, so "leaf from 1a2b3c4d" lines up
// with "CAs [1a2b3c4d]". It is what a failure window is explained with.
func Observe(ctx context.Context, c *cluster.Cluster, tl *realcluster.Timeline) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	run := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	run(func() {
		last := ""
		realcluster.WatchLoop(ctx, func(ctx context.Context) (watch.Interface, error) {
			return c.Client.CoreV1().Secrets(Namespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + SecretName})
		}, func(ev watch.Event) {
			s, ok := ev.Object.(*corev1.Secret)
			if !ok {
				return
			}
			now := describeSecret(s)
			if ev.Type == watch.Deleted {
				now = "deleted"
			}
			if now != last {
				last = now
				tl.Add("secret: %s", now)
			}
		})
	})
	reg := c.Client.AdmissionregistrationV1()
	run(func() {
		last := ""
		realcluster.WatchLoop(ctx, func(ctx context.Context) (watch.Interface, error) {
			return reg.MutatingWebhookConfigurations().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + MutatingName})
		}, func(ev watch.Event) {
			m, ok := ev.Object.(*admissionregistrationv1.MutatingWebhookConfiguration)
			if !ok {
				return
			}
			var bundles [][]byte
			for _, w := range m.Webhooks {
				bundles = append(bundles, w.ClientConfig.CABundle)
			}
			if now := describeBundles(bundles); now != last {
				last = now
				tl.Add("mutating webhooks' caBundle: %s", now)
			}
		})
	})
	run(func() {
		last := ""
		realcluster.WatchLoop(ctx, func(ctx context.Context) (watch.Interface, error) {
			return reg.ValidatingWebhookConfigurations().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + ValidatingName})
		}, func(ev watch.Event) {
			v, ok := ev.Object.(*admissionregistrationv1.ValidatingWebhookConfiguration)
			if !ok {
				return
			}
			var bundles [][]byte
			for _, w := range v.Webhooks {
				bundles = append(bundles, w.ClientConfig.CABundle)
			}
			if now := describeBundles(bundles); now != last {
				last = now
				tl.Add("validating webhooks' caBundle: %s", now)
			}
		})
	})
	run(func() { probeServed(ctx, c, tl) })
	return func() { cancel(); wg.Wait() }
}

// probeServed records, per manager pod, what its webhook port answers a
// TLS handshake with: the CA its leaf is from, or the dial error.
func probeServed(ctx context.Context, c *cluster.Cluster, tl *realcluster.Timeline) {
	last := map[string]string{}
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		list, err := c.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: Selector})
		if err != nil {
			continue
		}
		seen := map[string]bool{}
		for _, p := range list.Items {
			if p.Status.PodIP == "" {
				continue
			}
			seen[p.Name] = true
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			leaf, err := ServedLeaf(pctx, net.JoinHostPort(p.Status.PodIP, strconv.Itoa(WebhookPort)))
			cancel()
			now := ""
			if err != nil {
				now = "does not serve: " + shortErr(err)
			} else {
				now = "serves a leaf from " + keyID(leaf.AuthorityKeyId)
			}
			if now != last[p.Name] {
				last[p.Name] = now
				tl.Add("pod %s %s", p.Name, now)
			}
		}
		for name := range last {
			if !seen[name] {
				delete(last, name)
			}
		}
	}
}

// shortErr keeps the end of a dial error ("connect: connection refused").
func shortErr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 && strings.Contains(s[:i], "dial") {
		if j := strings.LastIndex(s[:i], ": "); j >= 0 {
			return s[j+2:]
		}
	}
	return s
}

// keyID is the first 4 bytes of a key identifier in hex ("none" if empty).
func keyID(id []byte) string {
	if len(id) == 0 {
		return "none"
	}
	return fmt.Sprintf("%x", id[:min(4, len(id))])
}

func caIDs(cas []*x509.Certificate) string {
	var ids []string
	for _, ca := range cas {
		ids = append(ids, keyID(ca.SubjectKeyId))
	}
	return "[" + strings.Join(ids, " ") + "]"
}

func describeSecret(s *corev1.Secret) string {
	cas, _ := ParseCerts(s.Data["ca.crt"])
	leaf, _ := ParseCerts(s.Data["tls.crt"])
	d := "ca.crt CAs " + caIDs(cas)
	if len(leaf) > 0 {
		d += ", tls.crt a leaf from " + keyID(leaf[0].AuthorityKeyId)
	} else {
		d += ", no tls.crt"
	}
	if v, ok := s.Annotations[RotateAnnotation]; ok {
		d += ", " + RotateAnnotation + "=" + v
	}
	return d
}

// describeBundles names the CAs of the webhooks' caBundles ("mixed" when
// the webhooks of one configuration disagree).
func describeBundles(bundles [][]byte) string {
	var first string
	for i, b := range bundles {
		cas, _ := ParseCerts(b)
		d := "CAs " + caIDs(cas)
		if i == 0 {
			first = d
		} else if d != first {
			all := []string{}
			for _, b := range bundles {
				cas, _ := ParseCerts(b)
				all = append(all, caIDs(cas))
			}
			slices.Sort(all)
			return "mixed " + strings.Join(slices.Compact(all), " ")
		}
	}
	return first
}
