// Package egress is berth's egress proxy: a sandboxed run's only way out.
// One Server serves one run on that run's Unix socket. It checks the run's
// token on every request, lets the agent call its own providers (at their
// configured endpoints, with the agent's model only) and adds the provider
// key on the way out; tunnels CONNECT and forwards plain HTTP to what the
// agent's [agents.egress] allow rules name; refuses everything else with a
// 403 that says why; refuses loopback, link-local, private and the host's
// own addresses at dial time unless a rule names the host; and records every
// decision. It runs as its own unprivileged process (cmd/berth-egress,
// started per run by Launch), never with the Docker socket; see
// docs/adr/0011-egress-gateway.md.
package egress

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/isolation"
)

// Provider is a provider the run may call, key included.
type Provider struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	BaseURL string `json:"base_url"`
	Model   string `json:"model"`
	Key     string `json:"key"`
}

// Policy is what one run may reach.
type Policy struct {
	RunID     string                 `json:"run_id"`
	Agent     string                 `json:"agent"`
	Token     string                 `json:"token"`
	Providers []Provider             `json:"providers,omitempty"`
	Allow     []isolation.EgressRule `json:"allow,omitempty"`
	// Secrets are added to requests for their hosts, which the proxy
	// intercepts with CA (see secrets.go); other hosts are never intercepted.
	Secrets []Secret `json:"secrets,omitempty"`
	CA      *CA      `json:"ca,omitempty"`
}

// Options tune a Server; zero values are the defaults.
type Options struct {
	Logger *slog.Logger
	// Resolver resolves destination names (the proxy's, never the sandbox's).
	Resolver interface {
		LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
	}
	// MaxConns bounds the run's simultaneous connections to the proxy (32).
	MaxConns int
	// MaxHeaderBytes bounds a request's header (16 KiB).
	MaxHeaderBytes int
	// MaxProviderBody bounds a provider request body the proxy reads to
	// check its model (16 MiB).
	MaxProviderBody int64
	// DialTimeout bounds name resolution and connecting (10 s);
	// ResponseTimeout waits for an upstream's response header (5 min: a
	// model may think long).
	DialTimeout     time.Duration
	ResponseTimeout time.Duration
	// MaxDecisions bounds the decisions kept (isolation.MaxEgressDecisions).
	MaxDecisions int
	// OnDecision sees every decision as it is made.
	OnDecision func(isolation.EgressDecision)
	// RootCAs verifies upstream TLS; nil is the system's pool.
	RootCAs *x509.CertPool
	// OwnAddrs are the host's own addresses (refused like loopback); nil
	// reads the interfaces.
	OwnAddrs []netip.Addr
}

// Server is one run's egress proxy.
type Server struct {
	pol       Policy
	opts      Options
	log       *slog.Logger
	http      *http.Server
	transport *http.Transport
	icpt      *interceptor
	revoked   atomic.Bool

	mu        sync.Mutex
	closed    bool
	active    sync.WaitGroup // requests being served
	decisions []isolation.EgressDecision
	dropped   int
	tunnels   map[net.Conn]struct{}
}

// NewServer makes the proxy of one run.
func NewServer(pol Policy, opts Options) (*Server, error) {
	if len(pol.Token) < 16 {
		return nil, errors.New("cannot make an egress proxy: the run token is missing or too short")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = 32
	}
	if opts.MaxHeaderBytes <= 0 {
		opts.MaxHeaderBytes = 16 << 10
	}
	if opts.MaxProviderBody <= 0 {
		opts.MaxProviderBody = 16 << 20
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 10 * time.Second
	}
	if opts.ResponseTimeout <= 0 {
		opts.ResponseTimeout = 5 * time.Minute
	}
	if opts.MaxDecisions <= 0 {
		opts.MaxDecisions = isolation.MaxEgressDecisions
	}
	if opts.OwnAddrs == nil {
		opts.OwnAddrs = interfaceAddrs()
	}
	for _, p := range pol.Providers {
		if _, err := providerURL(p, ""); err != nil {
			return nil, err
		}
	}
	s := &Server{pol: pol, opts: opts, tunnels: map[net.Conn]struct{}{},
		log: opts.Logger.With("run_id", pol.RunID, "agent", pol.Agent)}
	if pol.CA != nil {
		icpt, err := newInterceptor(*pol.CA)
		if err != nil {
			return nil, err
		}
		s.icpt = icpt
	}
	for i, sec := range pol.Secrets {
		if sec.Header == "" || sec.Value == "" || len(sec.Hosts) == 0 {
			return nil, fmt.Errorf("cannot make an egress proxy: secret %q needs hosts, a header and a value", sec.Name)
		}
		for j, h := range sec.Hosts {
			pol.Secrets[i].Hosts[j] = strings.ToLower(strings.TrimSuffix(h, "."))
		}
	}
	s.transport = &http.Transport{
		DialContext:           s.dialForTransport,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   opts.DialTimeout,
		ResponseHeaderTimeout: opts.ResponseTimeout,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		Proxy:                 nil,
	}
	if opts.RootCAs != nil {
		s.transport.TLSClientConfig = tlsConfig(opts.RootCAs)
	}
	s.http = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    opts.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	return s, nil
}

// Serve serves the run on ln until Close.
func (s *Server) Serve(ln net.Listener) error {
	err := s.http.Serve(&limitListener{Listener: ln, slots: make(chan struct{}, s.opts.MaxConns)})
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close revokes the run's token, ends every connection and waits until
// each request being served has recorded its decision.
func (s *Server) Close() error {
	s.revoked.Store(true)
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	err := s.http.Close()
	s.mu.Lock()
	for c := range s.tunnels {
		c.Close()
	}
	s.mu.Unlock()
	s.transport.CloseIdleConnections()
	s.active.Wait()
	return err
}

// Decisions are the decisions kept, oldest first, and how many were left out.
func (s *Server) Decisions() ([]isolation.EgressDecision, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]isolation.EgressDecision(nil), s.decisions...), s.dropped
}

func (s *Server) record(d isolation.EgressDecision) {
	d.Time = d.Time.UTC()
	s.mu.Lock()
	if len(s.decisions) < s.opts.MaxDecisions {
		s.decisions = append(s.decisions, d)
	} else {
		s.dropped++
	}
	s.mu.Unlock()
	if s.opts.OnDecision != nil {
		// The receiver logs it (the scheduler, with the run's attributes).
		s.opts.OnDecision(d)
		return
	}
	logDecision(s.log, d)
}

// logDecision logs one decision; log carries run_id and agent (the journal
// has them as RUN_ID and AGENT: journalctl RUN_ID=<run> ALLOWED=false finds
// a run's refusals). The rule that matched and the reason for a refusal are
// left out when empty, so the journal holds no empty fields.
func logDecision(log *slog.Logger, d isolation.EgressDecision) {
	level := slog.LevelInfo
	if !d.Allowed {
		level = slog.LevelWarn
	}
	attrs := []any{"method", d.Method, "host", d.Host, "port", d.Port, "path", d.Path, "allowed", d.Allowed}
	if d.Rule != "" {
		attrs = append(attrs, "rule", d.Rule)
	}
	if d.Reason != "" {
		attrs = append(attrs, "reason", d.Reason)
	}
	log.Log(context.Background(), level, "egress decision", append(attrs, "bytes_up", d.BytesUp, "bytes_down", d.BytesDown)...)
}

// refuse answers 403 (or code) with the reason in the body and records it.
func (s *Server) refuse(w http.ResponseWriter, d isolation.EgressDecision, code int, reason string) {
	d.Allowed, d.Reason = false, reason
	s.record(d)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Berth-Egress", "refused")
	w.WriteHeader(code)
	fmt.Fprintf(w, "berth egress refused %s %s:%d: %s\n", d.Method, d.Host, d.Port, reason)
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		http.Error(w, "berth egress: the run has ended", http.StatusServiceUnavailable)
		return
	}
	s.active.Add(1)
	s.mu.Unlock()
	defer s.active.Done()
	d := isolation.EgressDecision{Time: time.Now(), Method: r.Method}
	if !s.authorized(r) {
		d.Host, d.Port = splitHostPort(r.Host, 80)
		w.Header().Set("Proxy-Authenticate", `Bearer realm="berth-egress"`)
		s.refuse(w, d, http.StatusProxyAuthRequired, "no valid token of this run (the token ends with its run)")
		return
	}
	switch {
	case r.Method == http.MethodConnect:
		s.tunnel(w, r, d)
	case r.URL.IsAbs():
		s.forward(w, r, d)
	case strings.HasPrefix(r.URL.Path, "/providers/"):
		s.provider(w, r, d)
	default:
		d.Host, d.Port, d.Path = "", 0, r.URL.Path
		s.refuse(w, d, http.StatusBadRequest, "not a proxy request: want CONNECT, an absolute http:// URL or /providers/<name>/...")
	}
}

func (s *Server) authorized(r *http.Request) bool {
	if s.revoked.Load() {
		return false
	}
	got, ok := strings.CutPrefix(r.Header.Get("Proxy-Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(s.pol.Token)) == 1
}

// rule is the allow rule that lets method reach host:port.
func (s *Server) rule(method, host string, port int) (isolation.EgressRule, bool) {
	return isolation.MatchEgressRule(s.pol.Allow, method, host, port)
}

// named says whether a rule names host explicitly.
func (s *Server) named(host string) bool {
	for _, r := range s.pol.Allow {
		if r.Names(host) {
			return true
		}
	}
	return false
}

func noRule(method, host string, port int) string {
	return fmt.Sprintf("no [agents.egress] allow rule matches %s %s:%d", method, host, port)
}

func (s *Server) tunnel(w http.ResponseWriter, r *http.Request, d isolation.EgressDecision) {
	d.Host, d.Port = splitHostPort(r.Host, 443)
	rule, ok := s.rule(http.MethodConnect, d.Host, d.Port)
	// A secret's host, where a rule allows it, is always reached through
	// the interceptor, which adds the secret.
	if sec := s.secretFor(d.Host); sec != nil && ok {
		d.Rule = "secret " + sec.Name
		s.intercept(w, r, d, sec)
		return
	}
	if !ok {
		s.refuse(w, d, http.StatusForbidden, noRule(http.MethodConnect, d.Host, d.Port))
		return
	}
	d.Rule = rule.Raw
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.DialTimeout)
	upstream, err := s.dial(ctx, d.Host, d.Port, s.named(d.Host))
	cancel()
	if err != nil {
		s.dialFailed(w, d, err)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		upstream.Close()
		s.refuse(w, d, http.StatusInternalServerError, "cannot tunnel on this connection")
		return
	}
	client, buf, err := hj.Hijack()
	if err != nil {
		upstream.Close()
		return
	}
	s.track(client, upstream)
	defer s.untrack(client, upstream)
	if _, err := client.Write([]byte("HTTP/1.1 200 Connection Established\r\n\r\n")); err != nil {
		return
	}
	var up, down atomic.Int64
	done := make(chan struct{}, 2)
	go func() {
		n, _ := io.Copy(upstream, io.MultiReader(bytes.NewReader(bufferedBytes(buf)), client))
		up.Store(n)
		closeWrite(upstream)
		done <- struct{}{}
	}()
	go func() {
		n, _ := io.Copy(client, upstream)
		down.Store(n)
		closeWrite(client)
		done <- struct{}{}
	}()
	<-done
	<-done
	d.Allowed, d.BytesUp, d.BytesDown = true, up.Load(), down.Load()
	s.record(d)
}

func (s *Server) forward(w http.ResponseWriter, r *http.Request, d isolation.EgressDecision) {
	d.Host, d.Port = splitHostPort(r.URL.Host, 80)
	d.Path = r.URL.Path
	if r.URL.Scheme != "http" {
		s.refuse(w, d, http.StatusBadRequest, fmt.Sprintf("scheme %q: plain requests must be http://, use CONNECT for https", r.URL.Scheme))
		return
	}
	rule, ok := s.rule(r.Method, d.Host, d.Port)
	if !ok {
		s.refuse(w, d, http.StatusForbidden, noRule(r.Method, d.Host, d.Port))
		return
	}
	d.Rule = rule.Raw
	out := r.Clone(withPermit(r.Context(), s.named(d.Host)))
	out.RequestURI = ""
	stripHopHeaders(out.Header)
	s.roundTrip(w, out, d)
}

func (s *Server) provider(w http.ResponseWriter, r *http.Request, d isolation.EgressDecision) {
	name, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/providers/"), "/")
	d.Path = r.URL.Path
	var p *Provider
	for i := range s.pol.Providers {
		if s.pol.Providers[i].Name == name {
			p = &s.pol.Providers[i]
		}
	}
	if p == nil {
		s.refuse(w, d, http.StatusForbidden, fmt.Sprintf("%q is not one of the run's providers", name))
		return
	}
	target, _ := providerURL(*p, "/"+rest)
	target.RawQuery = r.URL.RawQuery
	d.Host, d.Port = splitHostPort(target.Host, defaultPort(target.Scheme))
	d.Path = target.Path
	if r.Method != http.MethodPost {
		s.refuse(w, d, http.StatusForbidden, fmt.Sprintf("provider %s: only POST model calls pass, not %s", p.Name, r.Method))
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, s.opts.MaxProviderBody+1))
	if err != nil {
		s.refuse(w, d, http.StatusBadRequest, "cannot read the request body")
		return
	}
	if int64(len(body)) > s.opts.MaxProviderBody {
		s.refuse(w, d, http.StatusRequestEntityTooLarge, fmt.Sprintf("provider request body over %d bytes", s.opts.MaxProviderBody))
		return
	}
	var call struct {
		Model *string `json:"model"`
	}
	if err := json.Unmarshal(body, &call); err != nil || call.Model == nil {
		s.refuse(w, d, http.StatusForbidden, fmt.Sprintf("provider %s: the request body names no model", p.Name))
		return
	}
	if *call.Model != p.Model {
		s.refuse(w, d, http.StatusForbidden, fmt.Sprintf("provider %s: model %q is not the agent's model %q", p.Name, *call.Model, p.Model))
		return
	}
	d.Rule = "provider " + p.Name
	out, err := http.NewRequestWithContext(withPermit(r.Context(), true), http.MethodPost, target.String(), bytes.NewReader(body))
	if err != nil {
		s.refuse(w, d, http.StatusBadRequest, "cannot build the provider request")
		return
	}
	for k, v := range r.Header {
		out.Header[k] = v
	}
	stripHopHeaders(out.Header)
	out.Header.Del("Authorization")
	out.Header.Del("X-Api-Key")
	out.Header.Del("Cookie")
	switch p.Kind {
	case "anthropic":
		out.Header.Set("X-Api-Key", p.Key)
	default:
		out.Header.Set("Authorization", "Bearer "+p.Key)
	}
	out.ContentLength = int64(len(body))
	s.roundTrip(w, out, d)
}

// roundTrip sends out upstream and copies the answer back.
func (s *Server) roundTrip(w http.ResponseWriter, out *http.Request, d isolation.EgressDecision) {
	var up countingReader
	if out.Body != nil && out.Body != http.NoBody {
		up.r = out.Body
		out.Body = io.NopCloser(&up)
	}
	resp, err := s.transport.RoundTrip(out)
	if err != nil {
		d.BytesUp = up.n
		s.dialFailed(w, d, err)
		return
	}
	defer resp.Body.Close()
	stripHopHeaders(resp.Header)
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	var dst io.Writer = w
	if resp.ContentLength < 0 || strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		// A stream (a model's server-sent events, chunked output): each
		// piece goes on as it arrives. A body of known length is copied in
		// large writes instead.
		dst = flushWriter{w}
	}
	down, _ := io.Copy(dst, resp.Body)
	d.Allowed, d.BytesUp, d.BytesDown = true, up.n, down
	s.record(d)
}

func (s *Server) dialFailed(w http.ResponseWriter, d isolation.EgressDecision, err error) {
	var ref *refusal
	if errors.As(err, &ref) {
		s.refuse(w, d, http.StatusForbidden, ref.reason)
		return
	}
	s.refuse(w, d, http.StatusBadGateway, "cannot reach the destination: "+err.Error())
}

// refusal is a destination refused at dial time.
type refusal struct{ reason string }

func (r *refusal) Error() string { return r.reason }

type permitKey struct{}

// withPermit says whether the dial may reach internal addresses (a rule or
// the provider config names the host).
func withPermit(ctx context.Context, internal bool) context.Context {
	return context.WithValue(ctx, permitKey{}, internal)
}

func (s *Server) dialForTransport(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port := splitHostPort(addr, 80)
	internal, _ := ctx.Value(permitKey{}).(bool)
	ctx, cancel := context.WithTimeout(ctx, s.opts.DialTimeout)
	defer cancel()
	return s.dial(ctx, host, port, internal)
}

// dial resolves host itself and connects to the first address it may reach;
// internal addresses only when internal is true. The address dialled is the
// one checked, so a name cannot be re-resolved to somewhere else.
func (s *Server) dial(ctx context.Context, host string, port int, internal bool) (net.Conn, error) {
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		addrs, err = s.opts.Resolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, fmt.Errorf("cannot resolve %s: %w", host, err)
		}
	}
	var refused string
	var dialer net.Dialer
	var lastErr error
	for _, a := range addrs {
		a = a.Unmap()
		if why := s.internalAddr(a); why != "" && !internal {
			refused = fmt.Sprintf("%s resolves to %s, %s; only a rule naming %s exactly allows that", host, a, why, host)
			continue
		}
		c, err := dialer.DialContext(ctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		if err == nil {
			return c, nil
		}
		lastErr = err
	}
	if lastErr != nil {
		return nil, lastErr
	}
	if refused != "" {
		return nil, &refusal{reason: refused}
	}
	return nil, fmt.Errorf("%s has no address", host)
}

var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// internalAddr says why a is not on the internet, or "".
func (s *Server) internalAddr(a netip.Addr) string {
	switch {
	case a.IsLoopback():
		return "a loopback address"
	case a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast():
		return "a link-local address (cloud metadata lives there)"
	case a.IsPrivate() || cgnat.Contains(a):
		return "a private address"
	case a.IsUnspecified() || a.IsMulticast() || a.IsInterfaceLocalMulticast():
		return "not a unicast address"
	}
	for _, own := range s.opts.OwnAddrs {
		if own == a {
			return "an address of this host"
		}
	}
	return ""
}

func interfaceAddrs() []netip.Addr {
	out := []netip.Addr{}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return out
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out
}

// providerURL is p's endpoint with rest appended to its path.
func providerURL(p Provider, rest string) (*url.URL, error) {
	u, err := url.Parse(p.BaseURL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("provider %s: base URL %q is not an absolute http(s) URL", p.Name, p.BaseURL)
	}
	if rest != "" {
		u.Path = path.Join("/", u.Path, rest)
	}
	return u, nil
}

func defaultPort(scheme string) int {
	if scheme == "https" {
		return 443
	}
	return 80
}

func splitHostPort(hostport string, def int) (string, int) {
	host, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return strings.Trim(hostport, "[]"), def
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return host, 0
	}
	return host, port
}

var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func stripHopHeaders(h http.Header) {
	for _, f := range h.Values("Connection") {
		for name := range strings.SplitSeq(f, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

func (s *Server) track(conns ...net.Conn) {
	s.mu.Lock()
	for _, c := range conns {
		s.tunnels[c] = struct{}{}
	}
	revoked := s.revoked.Load()
	s.mu.Unlock()
	if revoked {
		for _, c := range conns {
			c.Close()
		}
	}
}

func (s *Server) untrack(conns ...net.Conn) {
	s.mu.Lock()
	for _, c := range conns {
		delete(s.tunnels, c)
		c.Close()
	}
	s.mu.Unlock()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// flushWriter flushes after each write so streamed answers (SSE) flow.
type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
	return n, err
}

// limitListener lets at most cap(slots) connections be open at once; the
// next Accept waits for one to close.
type limitListener struct {
	net.Listener
	slots chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	l.slots <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &slotConn{Conn: c, release: func() { <-l.slots }}, nil
}

type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
