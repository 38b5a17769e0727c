package webhookcerts

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// KeyType names a private key algorithm and size.
type KeyType string

// Supported key types. ECDSA P-256 is the default: fast handshakes and small
// certificates, and every API server version verifies it.
const (
	ECDSAP256 KeyType = "ecdsa-p256"
	ECDSAP384 KeyType = "ecdsa-p384"
	RSA2048   KeyType = "rsa-2048"
	RSA3072   KeyType = "rsa-3072"
	RSA4096   KeyType = "rsa-4096"
)

// ErrKeyType is returned for an unknown KeyType.
var ErrKeyType = errors.New("unsupported key type (want ecdsa-p256, ecdsa-p384, rsa-2048, rsa-3072 or rsa-4096)")

// ParseKeyType validates s; "" means ECDSAP256. Returns ErrKeyType.
func ParseKeyType(s string) (KeyType, error) {
	switch k := KeyType(s); k {
	case "":
		return ECDSAP256, nil
	case ECDSAP256, ECDSAP384, RSA2048, RSA3072, RSA4096:
		return k, nil
	}
	return "", fmt.Errorf("%w: %q", ErrKeyType, s)
}

// GenerateKey makes a private key of type t; "" means ECDSAP256.
func GenerateKey(t KeyType) (crypto.Signer, error) {
	var k crypto.Signer
	var err error
	switch t {
	case ECDSAP256, "":
		k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case ECDSAP384:
		k, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case RSA2048:
		k, err = rsa.GenerateKey(rand.Reader, 2048)
	case RSA3072:
		k, err = rsa.GenerateKey(rand.Reader, 3072)
	case RSA4096:
		k, err = rsa.GenerateKey(rand.Reader, 4096)
	default:
		return nil, fmt.Errorf("%w: %q", ErrKeyType, t)
	}
	if err != nil {
		return nil, fmt.Errorf("generate %s key: %w", t, err)
	}
	return k, nil
}

// EncodeKey PEM-encodes a private key as PKCS#8 ("PRIVATE KEY").
func EncodeKey(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("marshal private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseKey decodes a PEM private key in PKCS#8, PKCS#1 (RSA) or SEC 1 (EC) form.
func ParseKey(pemBytes []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		return nil, errors.New("no PEM private key found")
	}
	if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("PKCS#8 key of type %T cannot sign", k)
		}
		return s, nil
	}
	if k, err := x509.ParseECPrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	return nil, fmt.Errorf("unparsable private key (PEM type %q)", block.Type)
}

// ParseCertificates decodes every PEM CERTIFICATE block in data, in order.
// It returns an error when a block does not parse or none is found.
func ParseCertificates(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate %d: %w", len(out), err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate found")
	}
	return out, nil
}

// EncodeCertificates PEM-encodes certs in order.
func EncodeCertificates(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}
