package egress

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/isolation"
)

// Secret is a credential the proxy adds to requests for its hosts
// ([[egress.secrets]]): for those hosts only, it terminates the sandbox's
// TLS with the run's CA, sets Header to Format with "{}" replaced by Value,
// and opens its own TLS to the host.
type Secret struct {
	Name   string   `json:"name"`
	Hosts  []string `json:"hosts"`
	Header string   `json:"header"`
	Format string   `json:"format"`
	Value  string   `json:"value"`
}

// CA is the certificate authority a run's sandbox trusts for intercepted
// hosts. Each run gets its own, so a leaked key is worth one run.
type CA struct {
	CertPEM string `json:"cert_pem"`
	KeyPEM  string `json:"key_pem"`
}

// SystemBundles are where distributions keep the system's CA bundle; the
// first that exists joins the run's CA in the sandbox's bundle.
var SystemBundles = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"}

// Bundle is the system's CA bundle followed by the run's CA.
func (ca CA) Bundle() []byte {
	var out []byte
	for _, p := range SystemBundles {
		if data, err := os.ReadFile(p); err == nil {
			out = append(data, '\n')
			break
		}
	}
	return append(out, ca.CertPEM...)
}

// NewCA makes a run's CA, valid for a day.
func NewCA(runID string) (CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return CA{}, fmt.Errorf("cannot make the run's CA key: %w", err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "berth egress CA for run " + runID},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return CA{}, fmt.Errorf("cannot make the run's CA: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return CA{}, fmt.Errorf("cannot encode the run's CA key: %w", err)
	}
	return CA{
		CertPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		KeyPEM:  string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})),
	}, nil
}

// interceptor makes leaf certificates for intercepted hosts.
type interceptor struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey

	mu    sync.Mutex
	leafs map[string]*tls.Certificate
}

func newInterceptor(ca CA) (*interceptor, error) {
	cb, _ := pem.Decode([]byte(ca.CertPEM))
	kb, _ := pem.Decode([]byte(ca.KeyPEM))
	if cb == nil || kb == nil {
		return nil, errors.New("cannot read the run's CA: not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("cannot read the run's CA: %w", err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("cannot read the run's CA key: %w", err)
	}
	return &interceptor{cert: cert, key: key, leafs: map[string]*tls.Certificate{}}, nil
}

func (in *interceptor) leaf(host string) (*tls.Certificate, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if c, ok := in.leafs[host]; ok {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     in.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, in.cert, &key.PublicKey, in.key)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	in.leafs[host] = c
	return c, nil
}

// secretFor is the secret bound to host, if any.
func (s *Server) secretFor(host string) *Secret {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for i := range s.pol.Secrets {
		if slices.Contains(s.pol.Secrets[i].Hosts, host) {
			return &s.pol.Secrets[i]
		}
	}
	return nil
}

// intercept serves a CONNECT to a secret's host: TLS with the run's CA
// towards the sandbox, each request forwarded over the proxy's own TLS with
// the secret's header set. d is the CONNECT's decision.
func (s *Server) intercept(w http.ResponseWriter, r *http.Request, d isolation.EgressDecision, sec *Secret) {
	if s.icpt == nil {
		s.refuse(w, d, http.StatusInternalServerError, "secret "+sec.Name+": the run has no CA to intercept with")
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		s.refuse(w, d, http.StatusInternalServerError, "cannot intercept on this connection")
		return
	}
	client, _, err := hj.Hijack()
	if err != nil {
		return
	}
	s.track(client)
	defer s.untrack(client)
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		return
	}
	host, port := d.Host, d.Port
	conn := tls.Server(client, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.icpt.leaf(host)
		},
	})
	conn.SetDeadline(time.Now().Add(s.opts.DialTimeout))
	if err := conn.HandshakeContext(r.Context()); err != nil {
		return
	}
	br := bufio.NewReaderSize(conn, 4<<10)
	for {
		conn.SetReadDeadline(time.Now().Add(60 * time.Second))
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		conn.SetReadDeadline(time.Time{})
		rd := isolation.EgressDecision{Time: time.Now(), Method: req.Method, Host: host, Port: port, Path: req.URL.Path, Rule: "secret " + sec.Name}
		req.URL.Scheme, req.URL.Host = "https", net.JoinHostPort(host, fmt.Sprint(port))
		req.RequestURI = ""
		stripHopHeaders(req.Header)
		req.Header.Set(sec.Header, strings.ReplaceAll(sec.Format, "{}", sec.Value))
		var up countingReader
		if req.Body != nil && req.Body != http.NoBody {
			up.r = req.Body
			req.Body = io.NopCloser(&up)
		}
		resp, err := s.transport.RoundTrip(req.WithContext(withPermit(context.WithoutCancel(r.Context()), s.named(host))))
		if err != nil {
			rd.Allowed, rd.Reason, rd.BytesUp = false, "cannot reach the destination: "+err.Error(), up.n
			var ref *refusal
			if errors.As(err, &ref) {
				rd.Reason = ref.reason
			}
			s.record(rd)
			body := "berth egress refused " + req.Method + " " + host + ": " + rd.Reason + "\n"
			fmt.Fprintf(conn, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			continue
		}
		stripHopHeaders(resp.Header)
		var down countingReader
		down.r = resp.Body
		resp.Body = io.NopCloser(&down)
		err = resp.Write(conn)
		resp.Body.Close()
		rd.Allowed, rd.BytesUp, rd.BytesDown = true, up.n, down.n
		s.record(rd)
		if err != nil || req.Close || resp.Close {
			return
		}
	}
}
