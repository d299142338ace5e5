package egress_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/services/egress"
)

// leafFrom signs a server certificate for name with the run's CA, as one
// who stole the CA's key would.
func leafFrom(t *testing.T, ca egress.CA, name string) *x509.Certificate {
	t.Helper()
	cb, _ := pem.Decode([]byte(ca.CertPEM))
	kb, _ := pem.Decode([]byte(ca.KeyPEM))
	caCert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return leaf
}

// The run's CA is good for the intercepted hosts only, and for the run's
// time only: a leaf for any other name fails verification.
func TestTheRunsCAIsTrustedOnlyForTheInterceptedHosts(t *testing.T) {
	t.Parallel()
	ca, err := egress.NewCA("r1", []string{"api.github.test", "10.0.0.7"}, 30*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(ca.CertPEM))
	tests := []struct {
		name string
		ok   bool
	}{
		{"api.github.test", true},
		{"10.0.0.7", true},
		{"bank.example", false},
		{"github.test", false},
		{"10.0.0.8", false},
		{"::1", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := leafFrom(t, ca, tt.name).Verify(x509.VerifyOptions{Roots: roots, DNSName: tt.name})
			if tt.ok != (err == nil) {
				t.Fatalf("a leaf for %s verified: %v, want ok=%v", tt.name, err, tt.ok)
			}
		})
	}
	cb, _ := pem.Decode([]byte(ca.CertPEM))
	cert, _ := x509.ParseCertificate(cb.Bytes)
	if life := time.Until(cert.NotAfter); life > 31*time.Minute || life < 29*time.Minute {
		t.Fatalf("the CA lives %s, want the 30 minutes asked for", life)
	}
	t.Run("a_CA_with_names_only_constrains_addresses_too", func(t *testing.T) {
		ca, err := egress.NewCA("r2", []string{"api.github.test"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM([]byte(ca.CertPEM))
		if _, err := leafFrom(t, ca, "127.0.0.1").Verify(x509.VerifyOptions{Roots: roots}); err == nil {
			t.Fatal("a leaf for an address verified under a CA for a name only")
		}
	})
	if got := egress.CALifetime(time.Hour); got <= time.Hour || got > 2*time.Hour {
		t.Fatalf("CALifetime(1h) = %s, want the run and a small margin", got)
	}
}

// Keys and secret values travel to the proxy on its stdin and nowhere
// else: the plan's types never marshal them.
func TestKeysAndSecretValuesAreMarshalledOnlyForTheProxy(t *testing.T) {
	t.Parallel()
	pol := egress.Policy{RunID: "r1", Token: token,
		Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: "https://api.openai.test/v1", Model: "m", Key: openKey, Organization: "org-1"}},
		Secrets:   []egress.Secret{{Name: "github", Hosts: []string{"api.github.test"}, Header: "Authorization", Format: "Bearer {}", Value: githubToken, Paths: []string{"/repos"}}}}
	plan, err := json.Marshal(struct {
		Providers []egress.Provider
		Secrets   []egress.Secret
	}{pol.Providers, pol.Secrets})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(plan), openKey) || strings.Contains(string(plan), githubToken) {
		t.Fatalf("the plan's JSON carries a key: %s", plan)
	}
	wire, err := json.Marshal(pol)
	if err != nil {
		t.Fatal(err)
	}
	var back egress.Policy
	if err := json.Unmarshal(wire, &back); err != nil {
		t.Fatal(err)
	}
	if back.Providers[0].Key != openKey || back.Providers[0].Organization != "org-1" || back.Secrets[0].Value != githubToken || back.Secrets[0].Paths[0] != "/repos" || back.Token != token {
		t.Fatalf("the proxy's policy lost something on the way: %+v", back)
	}
}
