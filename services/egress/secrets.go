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
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// Secret is a credential the proxy adds to requests for its hosts
// ([[egress.secrets]]): for those hosts (and ports) only, it terminates the
// sandbox's TLS with the run's CA, sets Header to Format with "{}"
// replaced by Value on requests within the secret's scope, and opens its
// own TLS to the host.
type Secret = egresspolicy.Secret

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

// CALifetime is how long a run's CA lives for a run that may last
// runTimeout: the run and a margin for its clock and its end (a day when
// the run has no timeout).
func CALifetime(runTimeout time.Duration) time.Duration {
	if runTimeout <= 0 {
		return 24 * time.Hour
	}
	return runTimeout + 10*time.Minute
}

// NewCA makes a run's CA, valid for lifetime from now, and only for hosts:
// its X.509 name constraints permit exactly those names (and, as X.509
// has it, names under them) and IP addresses, so a leaf for any other
// name fails verification even if the CA's key leaked from the run.
func NewCA(runID string, hosts []string, lifetime time.Duration) (CA, error) {
	if lifetime <= 0 {
		return CA{}, errors.New("cannot make the run's CA: its lifetime must be positive")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return CA{}, fmt.Errorf("cannot make the run's CA key: %w", err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "berth egress CA for run " + runID},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(lifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign,
		// Critical, so a verifier that cannot read them refuses the CA.
		PermittedDNSDomainsCritical: true,
	}
	for _, h := range hosts {
		h = egresspolicy.NormalHost(h)
		if a, err := netip.ParseAddr(h); err == nil {
			tmpl.PermittedIPRanges = append(tmpl.PermittedIPRanges, &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())})
			continue
		}
		tmpl.PermittedDNSDomains = append(tmpl.PermittedDNSDomains, h)
	}
	// A kind of name with no constraint is unconstrained: permit only the
	// reserved "invalid." for names, and no address, when none is intercepted.
	if len(tmpl.PermittedDNSDomains) == 0 {
		tmpl.PermittedDNSDomains = []string{"invalid"}
	}
	if len(tmpl.PermittedIPRanges) == 0 {
		tmpl.ExcludedIPRanges = []*net.IPNet{{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, {IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}}
	}
	tmpl.PermittedURIDomains = []string{"invalid"}
	tmpl.PermittedEmailAddresses = []string{"invalid"}
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
		// No common name: OpenSSL judges a CN that looks like a name
		// against the CA's name constraints, which permit no names here.
		tmpl.Subject = pkix.Name{}
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

// interceptTransport is the transport of the tunnel to host:port: its
// own TLS names host, while each request goes to the address judged for
// it.
func (s *Server) interceptTransport(host string, port int) *http.Transport {
	key := net.JoinHostPort(host, strconv.Itoa(port))
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.intercepted[key]
	if !ok {
		t = s.newTransport(dialJudged, host)
		s.intercepted[key] = t
	}
	return t
}

// interceptRule names what a tunnel is intercepted for: a secret, or the
// agent's git rules when sec is nil.
func interceptRule(sec *Secret) string {
	if sec == nil {
		return "git"
	}
	return "secret " + sec.Name
}

// intercept serves a CONNECT to a secret's or a git rule's host: TLS
// with the run's CA towards the sandbox, each request judged again (its Host must be the
// tunnel's, its destination address allowed), the secret's header set when
// the request is in its scope, and sent over the proxy's own TLS. d is the
// CONNECT's decision.
func (s *Server) intercept(w http.ResponseWriter, r *http.Request, d egresspolicy.Decision, sec *Secret) {
	if s.icpt == nil {
		s.refuse(w, d, http.StatusInternalServerError, interceptRule(sec)+": the run has no CA to intercept with")
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		s.refuse(w, d, http.StatusInternalServerError, "cannot intercept on this connection")
		return
	}
	client, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	s.track(client)
	defer s.untrack(client)
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		return
	}
	host, port := d.Host, d.Port
	raw := &prefixConn{Conn: client, pre: bufferedBytes(buf)}
	conn := tls.Server(raw, &tls.Config{
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
	transport := s.interceptTransport(host, port)
	// The header read is bounded like the proxy's own (Go's reader is not);
	// a body is read through the same reader afterwards, unbounded.
	limited := &io.LimitedReader{R: conn}
	br := bufio.NewReaderSize(limited, 4<<10)
	for {
		conn.SetReadDeadline(time.Now().Add(s.opts.TunnelIdleTimeout))
		limited.N = int64(s.opts.MaxHeaderBytes) + 1
		req, err := http.ReadRequest(br)
		if err != nil {
			if limited.N <= 0 {
				writeRefusal(conn, http.StatusRequestHeaderFieldsTooLarge, "berth egress refused a request to "+host+": its header is over "+strconv.Itoa(s.opts.MaxHeaderBytes)+" bytes", false)
			}
			return
		}
		limited.N = 1 << 62
		conn.SetReadDeadline(time.Time{})
		if !s.interceptOne(conn, transport, req, r.Context(), host, port, sec) {
			return
		}
	}
}

// interceptOne judges and sends one request of an intercepted tunnel and
// says whether the tunnel may carry another.
func (s *Server) interceptOne(conn net.Conn, transport *http.Transport, req *http.Request, ctx context.Context, host string, port int, sec *Secret) bool {
	escaped := requestPath(req)
	rd := egresspolicy.Decision{Time: time.Now(), Method: req.Method, Host: host, Port: port, Path: req.URL.Path, Rule: interceptRule(sec)}
	refuseKeeping := func(code int, reason string, keep bool) bool {
		rd.Allowed, rd.Reason = false, reason
		s.record(rd)
		writeRefusal(conn, code, "berth egress refused "+req.Method+" "+host+": "+reason, keep)
		return keep
	}
	refuse := func(code int, reason string) bool {
		// The request's body is not read: the next request cannot be found.
		return refuseKeeping(code, reason, req.Body == nil || req.Body == http.NoBody)
	}
	if n := headerSize(req); n > s.opts.MaxHeaderBytes {
		// Past a header this large the tunnel carries nothing more.
		return refuseKeeping(http.StatusRequestHeaderFieldsTooLarge, fmt.Sprintf("the request header is %d bytes, over the %d allowed", n, s.opts.MaxHeaderBytes), false)
	}
	if err := egresspolicy.CheckFronting(host, port, req); err != nil {
		return refuse(http.StatusForbidden, interceptRule(sec)+": "+err.Error())
	}
	// A read-only run's tunnels are all intercepted (readonly.go): each
	// request is judged here before anything else.
	if sec == nil && s.pol.ReadOnly && !s.judge.GitHost(host, port) {
		rd.Rule = "read-only"
	}
	if ref := s.readOnlyInside(s.judgeFor(ctx), req, escaped, host, port); ref != nil {
		return refuse(ref.Code, ref.Reason)
	}
	dest, ref := s.destination(ctx, http.MethodConnect, host, port)
	if ref != nil && ref.Ask == nil && openedForAsks(ctx) {
		// The request's own method is judged (askinside.go).
		dest, ref = s.insideDestination(ctx, &rd)
	}
	if ref != nil {
		return refuse(ref.Code, ref.Reason)
	}
	req.URL.Scheme, req.URL.Host, req.URL.User = "https", netip.AddrPortFrom(dest.Addrs[0], uint16(port)).String(), nil
	req.Host = net.JoinHostPort(host, strconv.Itoa(port))
	if port == 443 {
		req.Host = host
	}
	req.RequestURI = ""
	stripHopHeaders(req.Header)
	// Git's smart HTTP on a git rule's host is judged by the git rules,
	// whatever secret the host has (git.go).
	if s.judge.GitHost(host, port) {
		if g, isGit, err := egresspolicy.ParseGitRequest(req.Method, escaped, req.URL.RawQuery); isGit {
			return s.gitOne(conn, transport, req, ctx, rd, g, err)
		}
		if _, ok := egresspolicy.MatchRule(s.pol.Allow, http.MethodConnect, host, port); !ok {
			return refuse(http.StatusForbidden, "only git's smart HTTP for the repositories of the agent's [[agents.egress.git]] rules goes to "+host+" (no allow rule names it)")
		}
	}
	if sec != nil {
		if ok, why := sec.Covers(req.Method, escaped); ok {
			req.Header.Set(sec.Header, strings.ReplaceAll(sec.Format, "{}", sec.Value))
		} else {
			rd.Rule, rd.Reason = "secret "+sec.Name+" (not added)", why
		}
	}
	return s.sendIntercepted(conn, transport, req, ctx, rd)
}

// requestPath is the path of r's request-target as sent (still
// percent-encoded, without the query), in origin or absolute form.
func requestPath(r *http.Request) string {
	target, _, _ := strings.Cut(r.RequestURI, "?")
	if _, rest, ok := strings.Cut(target, "://"); ok && !strings.HasPrefix(target, "/") {
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			return rest[i:]
		}
		return "/"
	}
	return target
}

// writeRefusal answers a request inside an intercepted tunnel.
// keep says whether the connection carries another request: when it does
// not, the refusal says so (Connection: close), so that a client does not
// send its next request on a connection the proxy is closing.
func writeRefusal(w io.Writer, code int, msg string, keep bool) {
	body := msg + "\n"
	closing := ""
	if !keep {
		closing = "Connection: close\r\n"
	}
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nX-Berth-Egress: refused\r\n%sContent-Length: %d\r\n\r\n%s", code, http.StatusText(code), closing, len(body), body)
}

// prefixConn reads pre before the connection: what the HTTP server had
// already read past the CONNECT.
type prefixConn struct {
	net.Conn
	pre []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
