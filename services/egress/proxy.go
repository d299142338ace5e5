// Package egress is berth's egress proxy: a sandboxed run's only way out.
// One Server serves one run on that run's Unix socket. It checks the run's
// token on every request, lets the agent call its own providers (only
// their API endpoints, with the agent's model only, with the headers a
// call needs) and adds the provider key on the way out; tunnels CONNECT
// and forwards plain HTTP to what the agent's [agents.egress] allow rules
// name; refuses everything else with a 403 that says why; refuses
// internal destinations unless the rule that allows the request names the
// host; and records every decision. Every request is judged by
// internal/egresspolicy, the code `berthctl egress explain` answers with.
// It runs as its own unprivileged process (cmd/berth-egress, started per
// run by Launch), never with the Docker socket; see
// docs/adr/0011-egress-gateway.md.
package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// Provider is a provider the run may call, key included.
type Provider = egresspolicy.Provider

// Policy is what one run may reach. Its JSON (the child's stdin) carries
// the provider keys and secret values, which the plan's JSON never does.
type Policy struct {
	RunID     string
	Agent     string
	Token     string
	Providers []Provider
	Allow     []egresspolicy.Rule
	// Ask are the [agents.egress] ask rules: what no allow rule allows but
	// one of these matches is held until a person answers, or until
	// ApprovalTimeout (0: egresspolicy.DefaultApprovalTimeout) has passed
	// (ask.go).
	Ask             []egresspolicy.Rule
	ApprovalTimeout time.Duration
	// ToolAsk are the [agents.tools] ask rules: a tool call berth-agent
	// asks about on its own channel is held like an asked request when
	// one of them matches it (toolask.go).
	ToolAsk []egresspolicy.ToolRule
	// Secrets are added to requests for their hosts, which the proxy
	// intercepts with CA (see secrets.go); other hosts are never intercepted.
	Secrets []Secret
	CA      *CA
	// Git are the agent's git rules, GitHubApps the apps their credentials
	// may name (git.go, githubapp.go).
	Git        []egresspolicy.GitRule
	GitHubApps []GitHubApp
	// AgentToken opens berth-agent's own channel (channel.go); "" for none.
	AgentToken string
	// Allowance is what the run may spend on provider calls when it
	// starts (nil: no budget); the scheduler sends newer ones on stdin
	// (budget.go). ReadOnly is [agents.egress] mode = "read-only".
	Allowance *egresspolicy.Allowance
	ReadOnly  bool
	// Traceparent is the run's W3C trace context, sent on every provider
	// call when [tracing] provider_traceparent is on ("": never; a
	// traceparent the sandbox sent is dropped as every header not on the
	// allow-list is).
	Traceparent string
}

type wireProvider struct {
	egresspolicy.Provider
	Key string `json:"key"`
}

type wireGitHubApp struct {
	egresspolicy.GitHubApp
	PrivateKey string `json:"private_key"`
}

type wireSecret struct {
	egresspolicy.Secret
	Value string `json:"value"`
}

type wirePolicy struct {
	RunID     string                  `json:"run_id"`
	Agent     string                  `json:"agent"`
	Token     string                  `json:"token"`
	AgentTok  string                  `json:"agent_token,omitempty"`
	Providers []wireProvider          `json:"providers,omitempty"`
	Allow     []egresspolicy.Rule     `json:"allow,omitempty"`
	Ask       []egresspolicy.Rule     `json:"ask,omitempty"`
	AskWithin time.Duration           `json:"approval_timeout,omitempty"`
	ToolAsk   []egresspolicy.ToolRule `json:"tool_ask,omitempty"`
	Secrets   []wireSecret            `json:"secrets,omitempty"`
	CA        *CA                     `json:"ca,omitempty"`
	Git       []egresspolicy.GitRule  `json:"git,omitempty"`
	Apps      []wireGitHubApp         `json:"github_apps,omitempty"`
	Allowance *egresspolicy.Allowance `json:"allowance,omitempty"`
	ReadOnly  bool                    `json:"read_only,omitempty"`
	TraceCtx  string                  `json:"traceparent,omitempty"`
}

// MarshalJSON writes the policy with its keys, for the proxy's stdin only.
func (p Policy) MarshalJSON() ([]byte, error) {
	w := wirePolicy{RunID: p.RunID, Agent: p.Agent, Token: p.Token, AgentTok: p.AgentToken, Allow: p.Allow, Ask: p.Ask, AskWithin: p.ApprovalTimeout, ToolAsk: p.ToolAsk, CA: p.CA, Git: p.Git, Allowance: p.Allowance, ReadOnly: p.ReadOnly, TraceCtx: p.Traceparent}
	for _, a := range p.GitHubApps {
		w.Apps = append(w.Apps, wireGitHubApp{GitHubApp: a, PrivateKey: a.PrivateKey})
	}
	for _, pr := range p.Providers {
		w.Providers = append(w.Providers, wireProvider{Provider: pr, Key: pr.Key})
	}
	for _, s := range p.Secrets {
		w.Secrets = append(w.Secrets, wireSecret{Secret: s, Value: s.Value})
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (p *Policy) UnmarshalJSON(data []byte) error {
	var w wirePolicy
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	*p = Policy{RunID: w.RunID, Agent: w.Agent, Token: w.Token, AgentToken: w.AgentTok, Allow: w.Allow, Ask: w.Ask, ApprovalTimeout: w.AskWithin, ToolAsk: w.ToolAsk, CA: w.CA, Git: w.Git, Allowance: w.Allowance, ReadOnly: w.ReadOnly, Traceparent: w.TraceCtx}
	for _, a := range w.Apps {
		a.GitHubApp.PrivateKey = a.PrivateKey
		p.GitHubApps = append(p.GitHubApps, a.GitHubApp)
	}
	for _, pr := range w.Providers {
		pr.Provider.Key = pr.Key
		p.Providers = append(p.Providers, pr.Provider)
	}
	for _, s := range w.Secrets {
		s.Secret.Value = s.Value
		p.Secrets = append(p.Secrets, s.Secret)
	}
	return nil
}

// Options tune a Server; zero values are the defaults.
type Options struct {
	Logger *slog.Logger
	// Resolver resolves destination names (the proxy's, never the sandbox's).
	Resolver egresspolicy.Resolver
	// Addresses classifies internal addresses; nil reads this host's
	// networks and gateways (egresspolicy.HostClassifier).
	Addresses *egresspolicy.Classifier
	// MaxConns bounds the run's simultaneous connections to the proxy (32).
	MaxConns int
	// MaxUnauthenticated bounds the connections that have not yet sent a
	// request with the run's token (8): one more closes the oldest once it
	// has been pending for AuthGrace, so idle ones never hold the slots
	// authenticated ones wait for.
	MaxUnauthenticated int
	// AuthTimeout closes a connection that sends no request with the
	// run's token in that time (10 s).
	AuthTimeout time.Duration
	// AuthGrace is how long a new connection may stay unauthenticated
	// before it can be closed to make room for another (1 s): what a real
	// client needs to send its first request.
	AuthGrace time.Duration
	// MaxHeaderBytes bounds a request's header, request line included
	// (16 KiB).
	MaxHeaderBytes int
	// MaxProviderBody bounds a provider request body the proxy reads to
	// check its model (16 MiB); MaxProviderBuffer bounds all provider
	// bodies held at once, across connections (32 MiB).
	MaxProviderBody   int64
	MaxProviderBuffer int64
	// DialTimeout bounds name resolution and connecting (10 s);
	// ResponseTimeout waits for an upstream's response header (5 min: a
	// model may think long).
	DialTimeout     time.Duration
	ResponseTimeout time.Duration
	// TunnelIdleTimeout closes a tunnel (or an intercepted one) through
	// which no byte went either way for that long (10 min).
	TunnelIdleTimeout time.Duration
	// OnDecision sees every decision as it is made; berth-egress streams
	// them to the scheduler, which keeps the run's record (record.go).
	OnDecision func(egresspolicy.Decision)
	// RootCAs verifies upstream TLS; nil is the system's pool.
	RootCAs *x509.CertPool
	// OnCall sees every provider call with its usage (usage.go);
	// berth-egress streams them to the scheduler like the decisions.
	OnCall func(egresspolicy.Call)
	// Clock times requests_per_minute, the calls and the approval
	// timeout; nil is the real one.
	Clock clockwork.Clock
	// OnAsk is told each request an ask rule holds (ask.go); the request
	// waits for Server.Answer with its ID. It must not block. Nil: nobody
	// is asked, and such a request is refused at once.
	OnAsk func(egresspolicy.Ask)
	// OnAskSettled is told how each ask ended, as the Answer that decided
	// it: By "timeout" when nobody answered within the approval timeout,
	// "" when the tool hung up or the run ended first. It must not block.
	OnAskSettled func(egresspolicy.Answer)
}

// Server is one run's egress proxy.
type Server struct {
	pol   Policy
	opts  Options
	log   *slog.Logger
	judge *egresspolicy.Judge
	http  *http.Server
	// Provider calls and tool requests never share a connection: a tool
	// could otherwise ride a pooled connection to a provider's address.
	providers *http.Transport
	tools     *http.Transport
	icpt      *interceptor
	git       *gitState
	idle      idleConns // getSpliced's connections between requests
	revoked   atomic.Bool
	budget    byteBudget
	allowance budgetState // provider spending (budget.go)
	asks      asks        // requests held for a person's answer (ask.go)

	mu          sync.Mutex
	closed      bool
	active      sync.WaitGroup // requests being served
	tunnels     map[net.Conn]struct{}
	intercepted map[string]*http.Transport // by tunnel target host:port

	// agentJudge judges berth-agent's own channel (channel.go).
	agentJudge *egresspolicy.Judge
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
	if opts.Addresses == nil {
		opts.Addresses = egresspolicy.HostClassifier()
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = 32
	}
	if opts.MaxUnauthenticated <= 0 {
		opts.MaxUnauthenticated = 8
	}
	if opts.AuthGrace <= 0 {
		opts.AuthGrace = time.Second
	}
	if opts.AuthTimeout <= 0 {
		opts.AuthTimeout = 10 * time.Second
	}
	if opts.MaxHeaderBytes <= 0 {
		opts.MaxHeaderBytes = 16 << 10
	}
	if opts.MaxProviderBody <= 0 {
		opts.MaxProviderBody = 16 << 20
	}
	if opts.MaxProviderBuffer <= 0 {
		opts.MaxProviderBuffer = 32 << 20
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 10 * time.Second
	}
	if opts.ResponseTimeout <= 0 {
		opts.ResponseTimeout = 5 * time.Minute
	}
	if opts.TunnelIdleTimeout <= 0 {
		opts.TunnelIdleTimeout = 10 * time.Minute
	}
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	for _, p := range pol.Providers {
		if _, err := p.BaseURLParsed(); err != nil {
			return nil, fmt.Errorf("cannot make an egress proxy: %w", err)
		}
		for _, e := range p.Endpoints {
			if err := egresspolicy.CheckEndpoint(e); err != nil {
				return nil, fmt.Errorf("cannot make an egress proxy: provider %s: %w", p.Name, err)
			}
		}
	}
	for i, sec := range pol.Secrets {
		if sec.Header == "" || sec.Value == "" || len(sec.Hosts) == 0 {
			return nil, fmt.Errorf("cannot make an egress proxy: secret %q needs hosts, a header and a value", sec.Name)
		}
		for j, h := range sec.Hosts {
			pol.Secrets[i].Hosts[j] = egresspolicy.NormalHost(h)
		}
	}
	s := &Server{pol: pol, opts: opts, tunnels: map[net.Conn]struct{}{}, intercepted: map[string]*http.Transport{},
		log:    opts.Logger.With("run_id", pol.RunID, "agent", pol.Agent),
		budget: byteBudget{max: opts.MaxProviderBuffer}, allowance: budgetState{clock: opts.Clock},
		asks: asks{pending: map[string]*heldAsk{}, standing: map[string]string{}, closing: make(chan struct{})}}
	if pol.Allowance != nil {
		s.allowance.set(*pol.Allowance)
	}
	s.judge = &egresspolicy.Judge{Allow: pol.Allow, Ask: pol.Ask, Providers: pol.Providers, Secrets: pol.Secrets, Agent: pol.Agent, Git: pol.Git, ReadOnly: pol.ReadOnly, Resolver: opts.Resolver, Addresses: opts.Addresses}
	s.agentJudge = s.judge.OnAgentChannel()
	if pol.CA != nil {
		icpt, err := newInterceptor(*pol.CA)
		if err != nil {
			return nil, err
		}
		s.icpt = icpt
	}
	s.providers = s.newTransport(s.dialProvider, "")
	s.tools = s.newTransport(dialJudged, "")
	// The forge's API is the admin's endpoint, reached like a provider's.
	git, err := newGitState(pol, &http.Client{Transport: s.newTransport(s.dialProvider, "")}, opts.DialTimeout)
	if err != nil {
		return nil, err
	}
	s.git = git
	s.http = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    opts.MaxHeaderBytes,
		ConnContext:       withConn,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	return s, nil
}

func (s *Server) newTransport(dial func(ctx context.Context, network, addr string) (net.Conn, error), serverName string) *http.Transport {
	t := &http.Transport{
		DialContext:           dial,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   s.opts.DialTimeout,
		ResponseHeaderTimeout: s.opts.ResponseTimeout,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		Proxy:                 nil,
	}
	if s.opts.RootCAs != nil || serverName != "" {
		t.TLSClientConfig = tlsConfig(s.opts.RootCAs)
		t.TLSClientConfig.ServerName = serverName
	}
	return t
}

// Serve serves the run on ln until Close.
func (s *Server) Serve(ln net.Listener) error {
	l := &limitListener{Listener: ln, slots: make(chan struct{}, s.opts.MaxConns),
		maxUnauthenticated: s.opts.MaxUnauthenticated, authTimeout: s.opts.AuthTimeout, authGrace: s.opts.AuthGrace}
	err := s.http.Serve(l)
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
	if !s.closed {
		close(s.asks.closing)
	}
	s.closed = true
	s.mu.Unlock()
	err := s.http.Close()
	s.mu.Lock()
	for c := range s.tunnels {
		c.Close()
	}
	s.mu.Unlock()
	s.active.Wait()
	s.git.close(s.log)
	s.providers.CloseIdleConnections()
	s.tools.CloseIdleConnections()
	s.idle.close()
	s.mu.Lock()
	for _, t := range s.intercepted {
		t.CloseIdleConnections()
	}
	s.mu.Unlock()
	return err
}

func (s *Server) record(d egresspolicy.Decision) {
	d.Time = d.Time.UTC()
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
func logDecision(log *slog.Logger, d egresspolicy.Decision) {
	level := slog.LevelInfo
	if !d.Allowed {
		level = slog.LevelWarn
	}
	attrs := []any{"method", d.Method, "host", d.Host, "port", d.Port, "path", d.Path, "allowed", d.Allowed}
	if d.Ref != "" {
		attrs = append(attrs, "ref", d.Ref)
	}
	if d.Rule != "" {
		attrs = append(attrs, "rule", d.Rule)
	}
	if d.Reason != "" {
		attrs = append(attrs, "reason", d.Reason)
	}
	log.Log(context.Background(), level, "egress decision", append(attrs, "bytes_up", d.BytesUp, "bytes_down", d.BytesDown)...)
}

// refuse answers 403 (or code) with the reason in the body and records it.
func (s *Server) refuse(w http.ResponseWriter, d egresspolicy.Decision, code int, reason string) {
	d.Allowed, d.Reason = false, reason
	s.record(d)
	if dw, ok := w.(*drainingWriter); ok {
		dw.drain(s.opts.MaxProviderBody)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Berth-Egress", "refused")
	w.WriteHeader(code)
	fmt.Fprintf(w, "berth egress refused %s %s:%d: %s\n", d.Method, d.Host, d.Port, reason)
}

func (s *Server) refusal(w http.ResponseWriter, d egresspolicy.Decision, r *egresspolicy.Refusal) {
	s.refuse(w, d, r.Code, r.Reason)
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
	d := egresspolicy.Decision{Time: time.Now(), Method: r.Method}
	w = &drainingWriter{ResponseWriter: w, body: r.Body}
	if n := headerSize(r); n > s.opts.MaxHeaderBytes {
		// Go's own bound lets a few KiB more through: the documented bound
		// is this one.
		d.Host, d.Port = splitHostPort(r.Host, 80)
		w.Header().Set("Connection", "close")
		s.refuse(w, d, http.StatusRequestHeaderFieldsTooLarge, fmt.Sprintf("the request header is %d bytes, over the %d allowed", n, s.opts.MaxHeaderBytes))
		return
	}
	agent, ok := s.channelOf(r)
	if !ok {
		d.Host, d.Port = splitHostPort(r.Host, 80)
		w.Header().Set("Proxy-Authenticate", `Bearer realm="berth-egress"`)
		s.refuse(w, d, http.StatusProxyAuthRequired, "no valid token of this run (the token ends with its run)")
		return
	}
	if c := connOf(r.Context()); c != nil {
		c.authenticated()
	}
	r = onChannel(r, agent)
	switch {
	case r.Method == http.MethodConnect:
		s.tunnel(w, r, d)
	case !r.URL.IsAbs() && r.URL.Path == egresspolicy.ToolAskPath:
		s.toolAsk(w, r)
	case r.URL.IsAbs():
		s.forward(w, r, d)
	case strings.HasPrefix(r.URL.Path, egresspolicy.ProvidersPrefix):
		s.provider(w, r, d)
	default:
		d.Host, d.Port, d.Path = "", 0, r.URL.Path
		s.refuse(w, d, http.StatusBadRequest, "not a proxy request: want CONNECT, an absolute http:// URL or /providers/<name>/...")
	}
}

// headerSize is the request's header as sent: the request line and each
// field line with its CRLF, and the blank line.
func headerSize(r *http.Request) int {
	n := len(r.Method) + 1 + len(r.RequestURI) + 1 + len(r.Proto) + 2 + 2
	if r.Host != "" {
		n += len("Host: ") + len(r.Host) + 2
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + 2 + len(v) + 2
		}
	}
	return n
}

// destination judges a tool's request with the proxy's resolver, bounded
// by DialTimeout.
func (s *Server) destination(ctx context.Context, method, host string, port int) (egresspolicy.Destination, *egresspolicy.Refusal) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.DialTimeout)
	defer cancel()
	dest, ref := s.judgeFor(ctx).Destination(ctx, method, host, port)
	if approved, r, ok := s.approvedDestination(ctx, ref, host, port); ok {
		return approved, r
	}
	return dest, ref
}

func (s *Server) tunnel(w http.ResponseWriter, r *http.Request, d egresspolicy.Decision) {
	d.Host, d.Port = splitHostPort(r.Host, 443)
	d.Host = egresspolicy.NormalHost(d.Host)
	ctx, dest, ref := s.destinationAsking(r.Context(), &d)
	if s.opensForAsks(ctx, ref, d.Host, d.Port) {
		// Its requests are judged inside, each with its own method.
		s.intercept(w, r.WithContext(context.WithValue(ctx, askInsideKey{}, true)), d, s.judgeFor(ctx).SecretFor(d.Host, d.Port))
		return
	}
	if ref != nil {
		s.refusal(w, d, ref)
		return
	}
	r = r.WithContext(ctx)
	// A secret's host, where a rule allows it, is always reached through
	// the interceptor, which adds the secret and judges each request.
	if sec := s.judgeFor(r.Context()).SecretFor(d.Host, d.Port); sec != nil || s.judge.GitHost(d.Host, d.Port) {
		d.Rule = interceptRule(sec)
		s.intercept(w, r, d, sec)
		return
	}
	if s.readOnlyTunnel(w, r, d, dest) {
		return
	}
	d.Rule = dest.Rule.Raw
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.DialTimeout)
	upstream, err := dialFirst(ctx, dest.Addrs, d.Port)
	cancel()
	if err != nil {
		s.refuse(w, d, http.StatusBadGateway, "cannot reach the destination: "+err.Error())
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
	d.BytesUp, d.BytesDown = pipe(client, upstream, bufferedBytes(buf), s.opts.TunnelIdleTimeout)
	d.Allowed = true
	s.record(d)
}

// dialFirst connects to the first of addrs that answers.
func dialFirst(ctx context.Context, addrs []netip.Addr, port int) (net.Conn, error) {
	var dialer net.Dialer
	var lastErr error
	for _, a := range addrs {
		c, err := dialer.DialContext(ctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		if err == nil {
			return c, nil
		}
		lastErr = err
	}
	if lastErr == nil {
		lastErr = errors.New("no address")
	}
	return nil, lastErr
}

func (s *Server) forward(w http.ResponseWriter, r *http.Request, d egresspolicy.Decision) {
	d.Host, d.Port = splitHostPort(r.URL.Host, 80)
	d.Host = egresspolicy.NormalHost(d.Host)
	d.Path = r.URL.Path
	if r.URL.Scheme != "http" {
		s.refuse(w, d, http.StatusBadRequest, fmt.Sprintf("scheme %q: plain requests must be http://, use CONNECT for https", r.URL.Scheme))
		return
	}
	if ref := s.judgeFor(r.Context()).ReadOnlyRefusal(r.Method, hasBody(r)); ref != nil {
		s.refusal(w, d, ref)
		return
	}
	_, dest, ref := s.destinationAsking(r.Context(), &d)
	if ref != nil {
		s.refusal(w, d, ref)
		return
	}
	d.Rule = dest.Rule.Raw
	out := r.Clone(r.Context())
	out.RequestURI = ""
	// The request goes to the address judged for it (a pooled connection
	// is reused only for that address), under its own Host.
	out.Host = r.URL.Host
	out.URL.Host = netip.AddrPortFrom(dest.Addrs[0], uint16(d.Port)).String()
	stripHopHeaders(out.Header)
	if r.Method == http.MethodGet && r.ContentLength == 0 {
		s.getSpliced(w, out, d)
		return
	}
	s.roundTrip(w, s.tools, out, d)
}

// splicedBody is the least a body must be for getSpliced to hand it to
// the kernel: below it, keeping the sandbox's connection is worth more.
const splicedBody = 1 << 20

// getSpliced sends a tool's GET itself, on a connection to the judged
// address kept from an earlier request or a new one, and a large answer of
// known length goes to the sandbox by splice (the kernel moves it, no copy
// through this process); the sandbox's connection then ends with it, as
// the answer says. Anything else is answered as roundTrip would.
func (s *Server) getSpliced(w http.ResponseWriter, out *http.Request, d egresspolicy.Decision) {
	addr := out.URL.Host
	var up *upstreamConn
	var resp *http.Response
	var stop func() bool
	for {
		up = s.idle.get(addr)
		kept := up != nil
		if !kept {
			ctx, cancel := context.WithTimeout(out.Context(), s.opts.DialTimeout)
			conn, err := dialJudged(ctx, "tcp", addr)
			cancel()
			if err != nil {
				s.dialFailed(w, d, err)
				return
			}
			up = newUpstreamConn(conn)
		}
		// The sandbox hanging up (or the run ending) ends the exchange.
		conn := up.conn
		stop = context.AfterFunc(out.Context(), func() { conn.Close() })
		var err error
		if resp, err = up.send(out, s.opts.ResponseTimeout); err == nil {
			break
		}
		stop()
		conn.Close()
		if !kept {
			s.dialFailed(w, d, err)
			return
		}
		// The destination closed a kept connection meanwhile: a GET is
		// sent again on a new one, as http.Transport does.
	}
	reusable := false
	defer func() {
		if reusable && !resp.Close {
			s.idle.put(addr, up)
		} else {
			up.conn.Close()
		}
	}()
	defer func() { reusable = stop() && reusable }()
	stripHopHeaders(resp.Header)
	hj, ok := w.(http.Hijacker)
	if resp.ContentLength < splicedBody || !ok || !bodyAllowed(resp.StatusCode) {
		reusable = s.relay(w, resp, d, nil) == nil
		resp.Body.Close()
		return
	}
	// From here the body is read past resp.Body, whose Close would wait
	// for it again.
	conn, cbuf, err := hj.Hijack()
	if err != nil {
		return
	}
	s.track(conn, up.conn)
	defer s.untrack(conn)
	defer s.forget(up.conn)
	resp.Header.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	resp.Header.Set("Connection", "close")
	fmt.Fprintf(cbuf, "HTTP/1.1 %03d %s\r\n", resp.StatusCode, http.StatusText(resp.StatusCode))
	resp.Header.Write(cbuf)
	cbuf.WriteString("\r\n")
	// What the header's reader holds already, then the rest from the socket.
	held := min(int64(up.br.Buffered()), resp.ContentLength)
	sent, err := io.CopyN(cbuf, up.br, held)
	if err == nil {
		err = cbuf.Flush()
	}
	if err == nil {
		var spliced int64
		spliced, err = spliceBody(conn, up.conn, resp.ContentLength-held, s.opts.TunnelIdleTimeout)
		sent += spliced
	}
	reusable = err == nil && up.br.Buffered() == 0
	// Allowed even when cut off, as roundTrip records it: the bytes say
	// how far it got.
	d.Allowed, d.BytesDown = true, sent
	s.record(d)
}

// maxResponseHeader bounds an upstream answer's header (http.Transport's
// default).
const maxResponseHeader = 10 << 20

// bodyAllowed says whether an answer with status may carry a body.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// readFinalResponse reads the response to req, past any interim (1xx) one.
func readFinalResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	for {
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 {
			return resp, nil
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return nil, errors.New("the destination switched protocols unasked")
		}
	}
}

func (s *Server) provider(w http.ResponseWriter, r *http.Request, d egresspolicy.Decision) {
	d.Path = r.URL.Path
	call, ref := s.judge.Provider(r.Method, requestPath(r))
	if call.URL != nil {
		d.Host, d.Port = splitHostPort(call.URL.Host, defaultPort(call.URL.Scheme))
		d.Path = call.URL.Path
	}
	if ref != nil {
		s.refusal(w, d, ref)
		return
	}
	p := call.Provider
	var body []byte
	if call.NeedsModel() {
		var taken int64
		var err error
		body, taken, err = s.readProviderBody(r.Body)
		defer s.budget.give(taken)
		if ref, ok := errors.AsType[*egresspolicy.Refusal](err); ok {
			s.refusal(w, d, ref)
			return
		}
		if err != nil {
			s.refuse(w, d, http.StatusBadRequest, "cannot read the request body")
			return
		}
		if err := egresspolicy.CheckModel(body, p.Model); err != nil {
			s.refuse(w, d, http.StatusForbidden, fmt.Sprintf("provider %s: %v", p.Name, err))
			return
		}
	}
	d.Rule = "provider " + p.Name
	if ref := s.allowance.admit(); ref != nil {
		s.refuseBudget(w, d, p, ref)
		s.reportCall(egresspolicy.Call{Time: s.opts.Clock.Now().UTC(), Provider: p.Name, Model: p.Model, Endpoint: call.Endpoint, Budget: ref.budget, BudgetReason: ref.reason})
		return
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, call.URL.String(), bytes.NewReader(body))
	if err != nil {
		s.refuse(w, d, http.StatusBadRequest, "cannot build the provider request")
		return
	}
	out.Header = egresspolicy.ProviderHeaders(*p, r.Header)
	if s.pol.Traceparent != "" {
		out.Header.Set("Traceparent", s.pol.Traceparent)
	}
	out.ContentLength = int64(len(body))
	if body == nil {
		out.Body = http.NoBody
	}
	s.meteredCall(w, out, d, p, call.Endpoint)
}

// readProviderBody reads a provider call's body within MaxProviderBody and
// the run's shared buffer budget; taken is what the caller gives back.
func (s *Server) readProviderBody(r io.Reader) (body []byte, taken int64, err error) {
	var buf bytes.Buffer
	chunk := make([]byte, 32<<10)
	for {
		n, rerr := r.Read(chunk)
		if n > 0 {
			if int64(buf.Len()+n) > s.opts.MaxProviderBody {
				return nil, taken, &egresspolicy.Refusal{Code: http.StatusRequestEntityTooLarge, Reason: fmt.Sprintf("provider request body over %d bytes", s.opts.MaxProviderBody)}
			}
			if !s.budget.take(int64(n)) {
				return nil, taken, &egresspolicy.Refusal{Code: http.StatusServiceUnavailable,
					Reason: fmt.Sprintf("the run's provider calls hold %d bytes of request bodies at once, the most the proxy buffers; retry when one is answered", s.opts.MaxProviderBuffer)}
			}
			taken += int64(n)
			buf.Write(chunk[:n])
		}
		if rerr == io.EOF {
			return buf.Bytes(), taken, nil
		}
		if rerr != nil {
			return nil, taken, rerr
		}
	}
}

// roundTrip sends out upstream on t and copies the answer back.
func (s *Server) roundTrip(w http.ResponseWriter, t *http.Transport, out *http.Request, d egresspolicy.Decision) {
	var up countingReader
	if out.Body != nil && out.Body != http.NoBody {
		up.r = out.Body
		out.Body = io.NopCloser(&up)
	}
	resp, err := t.RoundTrip(out)
	if err != nil {
		d.BytesUp = up.n
		s.dialFailed(w, d, err)
		return
	}
	defer resp.Body.Close()
	stripHopHeaders(resp.Header)
	s.relay(w, resp, d, &up)
}

// relay writes resp to the sandbox and records d with the bytes moved (up
// counts the request body sent, if any); the error is the copy's.
func (s *Server) relay(w http.ResponseWriter, resp *http.Response, d egresspolicy.Decision, up *countingReader) error {
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
	buf := copyBuffers.Get().(*[]byte)
	down, err := io.CopyBuffer(dst, resp.Body, *buf)
	copyBuffers.Put(buf)
	d.Allowed, d.BytesDown = true, down
	if up != nil {
		d.BytesUp = up.n
	}
	s.record(d)
	return err
}

func (s *Server) dialFailed(w http.ResponseWriter, d egresspolicy.Decision, err error) {
	if ref, ok := errors.AsType[*egresspolicy.Refusal](err); ok {
		s.refusal(w, d, ref)
		return
	}
	s.refuse(w, d, http.StatusBadGateway, "cannot reach the destination: "+err.Error())
}

// dialJudged connects to an address judged for the request: tool
// requests carry one in their URL, never a name, so a dial can reach no
// address that was not judged.
func dialJudged(ctx context.Context, network, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, &egresspolicy.Refusal{Code: http.StatusForbidden, Reason: fmt.Sprintf("%s is not a judged address", addr)}
	}
	var dialer net.Dialer
	return dialer.DialContext(ctx, network, ap.String())
}

// dialProvider connects to a provider's endpoint, which the admin named
// (so an internal address is allowed), resolving it with the proxy's
// resolver.
func (s *Server) dialProvider(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port := splitHostPort(addr, 443)
	ctx, cancel := context.WithTimeout(ctx, s.opts.DialTimeout)
	defer cancel()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else if addrs, err = s.opts.Resolver.LookupNetIP(ctx, "ip", host); err != nil {
		return nil, fmt.Errorf("cannot resolve %s: %w", host, err)
	}
	return dialFirst(ctx, addrs, port)
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

// forget stops tracking c, which stays open.
func (s *Server) forget(c net.Conn) {
	s.mu.Lock()
	delete(s.tunnels, c)
	s.mu.Unlock()
}

func (s *Server) untrack(conns ...net.Conn) {
	s.mu.Lock()
	for _, c := range conns {
		delete(s.tunnels, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
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

// copyBuffers hold the bodies relayed through userspace: a large read is
// fewer system calls per byte, and pooled it costs a small request nothing.
var copyBuffers = sync.Pool{New: func() any {
	b := make([]byte, 256<<10)
	return &b
}}

// flushWriter flushes after each write so streamed answers (SSE) flow.
type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
	return n, err
}

// byteBudget is what all provider bodies held at once may add up to: one
// run's calls cannot make the proxy hold more than that.
type byteBudget struct {
	mu        sync.Mutex
	used, max int64
}

func (b *byteBudget) take(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.max {
		return false
	}
	b.used += n
	return true
}

func (b *byteBudget) give(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

// drainingWriter reads what is left of a refused request's body before the
// refusal is written: a server that answers and closes while the sandbox
// still sends would make its relay see a broken pipe, not the reason.
type drainingWriter struct {
	http.ResponseWriter
	body io.Reader
}

// drain discards up to limit bytes of the body; a longer one is cut off.
func (w *drainingWriter) drain(limit int64) {
	if w.body == nil || w.body == http.NoBody {
		return
	}
	io.Copy(io.Discard, io.LimitReader(w.body, limit))
}

func (w *drainingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("cannot hijack this connection")
	}
	return hj.Hijack()
}

func (w *drainingWriter) Flush() {
	if fl, ok := w.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
}
