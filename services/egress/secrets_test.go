package egress_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

const githubToken = "ghp_test_SECRET_0123456789"

func TestASecretIsAddedForItsHostsOnlyAndNeverReachesTheSandbox(t *testing.T) {
	t.Parallel()
	// A fake GitHub API that answers only with the injected token.
	github, ghRoots := tlsServerFor(t, "api.github.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+githubToken {
			http.Error(w, `{"message":"Bad credentials"}`, http.StatusUnauthorized)
			return
		}
		io.WriteString(w, `{"login":"berth-bot"}`)
	}))
	other := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "auth="+r.Header.Get("Authorization"))
	}))
	other.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake below
	other.StartTLS()
	t.Cleanup(other.Close)
	_, ghPort, _ := net.SplitHostPort(github.Listener.Addr().String())
	_, otherPort, _ := net.SplitHostPort(other.Listener.Addr().String())
	ca, err := egress.NewCA("r1", []string{"api.github.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var rules []isolation.EgressRule
	for _, s := range []string{"api.github.test:" + ghPort, "files.test:" + otherPort} {
		r, err := isolation.ParseEgressRule(s)
		if err != nil {
			t.Fatal(err)
		}
		rules = append(rules, r)
	}
	upstreams := ghRoots
	upstreams.AddCert(other.Certificate())
	var stream streamed
	p := startProxy(t, egress.Policy{RunID: "r1", Allow: rules, CA: &ca,
		Secrets: []egress.Secret{{Name: "github", Hosts: []string{"api.github.test"}, Header: "Authorization", Format: "Bearer {}", Value: githubToken}}},
		egress.Options{Resolver: resolver{"api.github.test": "127.0.0.1", "files.test": "127.0.0.1"}, RootCAs: upstreams, OnDecision: stream.add})

	// The sandbox trusts the run's CA only (plus the system's, not here).
	sandboxRoots := x509.NewCertPool()
	sandboxRoots.AppendCertsFromPEM([]byte(ca.CertPEM))
	c := p.client(token)
	c.Transport.(*tokenRT).rt.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: sandboxRoots}

	code, body := do(t, c, "GET", "https://api.github.test:"+ghPort+"/user", "", "Authorization", "Bearer sandbox-guess")
	if code != 200 || body != `{"login":"berth-bot"}` {
		t.Fatalf("GitHub through the proxy: %d %q; want the token added", code, body)
	}
	if strings.Contains(body, githubToken) {
		t.Fatal("the token reached the sandbox")
	}
	// Another host is tunnelled, not intercepted: its own certificate,
	// which the sandbox's roots (the run's CA) do not trust, and no secret.
	if code, body := do(t, c, "GET", "https://files.test:"+otherPort+"/", ""); code != 0 || !strings.Contains(body, "certificate") {
		t.Fatalf("a host without a secret: %d %q; want a tunnel to its own certificate", code, body)
	}
	c.Transport.(*tokenRT).rt.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: upstreams, ServerName: "example.com"}
	if code, body := do(t, c, "GET", "https://files.test:"+otherPort+"/", ""); code != 200 || body != "auth=" {
		t.Fatalf("a host without a secret through a plain tunnel: %d %q", code, body)
	}
	p.srv.Close()
	decisions := stream.all()
	var secretCalls int
	for _, d := range decisions {
		if d.Rule == "secret github" && d.Allowed && d.Path == "/user" {
			secretCalls++
		}
	}
	if secretCalls != 1 {
		t.Errorf("decisions %+v; want one GitHub call recorded under its secret", decisions)
	}
}

// tlsServerFor is an HTTPS server whose certificate names host, and a pool
// that trusts it: what the real api.github.com is to the proxy.
func tlsServerFor(t *testing.T, host string, h http.Handler) (*httptest.Server, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return srv, pool
}
