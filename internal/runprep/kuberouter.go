package runprep

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/isolation"
)

// kubeRouter is berth's egress router for kubernetes runs (ADR 22): one
// TCP listener on [kubernetes] proxy_listen, the only address a run's pod
// may reach, that hands each connection to the berth-egress of the run
// whose token the connection's first request carries
// (Proxy-Authorization: Bearer, as berth-agent's relay sends on every
// request). The run's own proxy checks that token again on every request,
// so a connection cannot change runs halfway; a connection without a live
// run's token is refused with 407. The router holds no key.
type kubeRouter struct {
	addr string
	ln   net.Listener
	log  *slog.Logger

	mu   sync.Mutex
	runs map[[32]byte]string // sha256 of a run token → the run's egress socket
}

// Bounds of the router: how long a connection may take to send its first
// request's head, how large that head may be, and how long the run's
// socket may take to answer a dial.
const (
	routerHeadTimeout = 10 * time.Second
	routerMaxHead     = 16 << 10
	routerDialTimeout = 5 * time.Second
)

// kubeRouterFor is the router on addr, started on first use and kept for
// the process's life (a changed proxy_listen starts another).
func (p *Preparer) kubeRouterFor(addr string) (*kubeRouter, error) {
	p.routersMu.Lock()
	defer p.routersMu.Unlock()
	if r := p.routers[addr]; r != nil {
		return r, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on [kubernetes] proxy_listen %s for the pods' egress: %w", addr, err)
	}
	r := &kubeRouter{addr: addr, ln: ln, log: p.log, runs: map[[32]byte]string{}}
	if p.routers == nil {
		p.routers = map[string]*kubeRouter{}
	}
	p.routers[addr] = r
	go r.serve()
	p.log.Info("berth's egress router for kubernetes pods listens", "addr", ln.Addr().String())
	return r, nil
}

// routeKube puts a kubernetes run's proxy on the router under each of its
// tokens (the tools' run token and berth-agent's own, ADR 26); the func
// takes it off again.
func (p *Preparer) routeKube(plan isolation.Plan, tokens ...string) (func(), error) {
	if plan.Backend != isolation.BackendKubernetes || plan.Egress == nil {
		return func() {}, nil
	}
	r, err := p.kubeRouterFor(plan.Kube.ProxyAddr)
	if err != nil {
		return nil, &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot route the pod's egress", Err: err}
	}
	return r.add(plan.Egress.Socket, tokens...), nil
}

func (r *kubeRouter) add(socket string, tokens ...string) func() {
	var keys [][32]byte
	for _, t := range tokens {
		if t != "" {
			keys = append(keys, sha256.Sum256([]byte(t)))
		}
	}
	r.mu.Lock()
	for _, k := range keys {
		r.runs[k] = socket
	}
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		for _, k := range keys {
			delete(r.runs, k)
		}
		r.mu.Unlock()
	}
}

func (r *kubeRouter) lookup(token string) (string, bool) {
	if token == "" {
		return "", false
	}
	key := sha256.Sum256([]byte(token))
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.runs[key]
	return s, ok
}

func (r *kubeRouter) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			r.log.Warn("berth's egress router cannot accept a connection", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		go r.handle(c)
	}
}

// handle reads the connection's first request head, finds its run and
// splices the connection to that run's socket, head included.
func (r *kubeRouter) handle(c net.Conn) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(routerHeadTimeout))
	head, err := readHead(c)
	if err != nil {
		return
	}
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
	if err != nil {
		refuseConn(c, http.StatusBadRequest, "berth egress router: not an HTTP request")
		return
	}
	token, _ := strings.CutPrefix(req.Header.Get("Proxy-Authorization"), "Bearer ")
	socket, ok := r.lookup(token)
	if !ok {
		refuseConn(c, http.StatusProxyAuthRequired, "berth egress router: no running run has this token")
		return
	}
	up, err := net.DialTimeout("unix", socket, routerDialTimeout)
	if err != nil {
		refuseConn(c, http.StatusBadGateway, "berth egress router: the run's egress proxy did not answer")
		return
	}
	defer up.Close()
	_ = c.SetReadDeadline(time.Time{})
	if _, err := up.Write(head); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(up, c)
		if uc, ok := up.(*net.UnixConn); ok {
			_ = uc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(c, up)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}

// readHead reads up to the end of the first request's head (its empty
// line), at most routerMaxHead bytes; what follows it (a body, the rest of
// a tunnel) may be in the same read and is returned too.
func readHead(c net.Conn) ([]byte, error) {
	buf := make([]byte, 0, 4096)
	chunk := make([]byte, 4096)
	for {
		n, err := c.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if bytes.Contains(buf, []byte("\r\n\r\n")) {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
		if len(buf) > routerMaxHead {
			refuseConn(c, http.StatusRequestHeaderFieldsTooLarge, "berth egress router: request head too large")
			return nil, errors.New("request head too large")
		}
	}
}

func refuseConn(c net.Conn, code int, msg string) {
	_ = c.SetWriteDeadline(time.Now().Add(routerHeadTimeout))
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", code, http.StatusText(code), len(msg), msg)
}
