// Package egress is the sandbox's side of berth's egress gateway: an HTTP
// proxy on 127.0.0.1 of the sandbox's own network namespace that forwards
// every request to the run's Unix socket with the run's token, and the
// environment that points the agent's tools at it. The sandbox has no other
// way out (docs/adr/0011-egress-gateway.md); the token never reaches a tool.
package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
)

// Env is what a tool's environment gets so curl, pip, npm, git, apt and
// web_fetch use the proxy unchanged.
func Env(proxyAddr string) []string {
	u := "http://" + proxyAddr
	return []string{
		"HTTP_PROXY=" + u, "HTTPS_PROXY=" + u, "http_proxy=" + u, "https_proxy=" + u,
		"NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1",
		"npm_config_proxy=" + u, "npm_config_https_proxy=" + u,
	}
}

// EnvFor is Env for the request's egress, plus the CA bundle variables
// when the run intercepts hosts of [[egress.secrets]].
func EnvFor(e agentproto.Egress) []string {
	env := Env(e.ProxyAddr)
	if e.CABundle != "" {
		for _, k := range []string{"SSL_CERT_FILE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT"} {
			env = append(env, k+"="+e.CABundle)
		}
	}
	return env
}

// Proxy is the running in-sandbox proxy.
type Proxy struct {
	ln     net.Listener
	srv    *http.Server
	socket string
	token  string
	plain  *http.Transport  // absolute-form requests, proxied on
	origin *http.Transport  // /providers/ requests
	idle   chan *socketConn // get's connections between requests

	// network is "unix", or "tcp" for a pod's Socket "tcp:IP:port" (berth's
	// egress router on the berth host, ADR 22).
	network string
}

// Listen binds e.ProxyAddr. Call it before confining the process: Landlock
// then keeps every other bind refused, while the bound listener goes on.
func Listen(e agentproto.Egress) (*Proxy, error) {
	if e.ProxyAddr == "" || e.Socket == "" || e.Token == "" {
		return nil, errors.New("cannot start the egress proxy: the request's egress is incomplete")
	}
	ln, err := net.Listen("tcp", e.ProxyAddr)
	if err != nil {
		return nil, fmt.Errorf("cannot start the egress proxy on %s: %w", e.ProxyAddr, err)
	}
	p := &Proxy{ln: ln, socket: e.Socket, network: "unix", token: e.Token, idle: make(chan *socketConn, 4)}
	if addr, ok := strings.CutPrefix(e.Socket, "tcp:"); ok {
		p.network, p.socket = "tcp", addr
	}
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, p.network, p.socket)
	}
	p.plain = &http.Transport{DialContext: dial, Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "egress"}), MaxIdleConnsPerHost: 4}
	p.origin = &http.Transport{DialContext: dial, MaxIdleConnsPerHost: 4}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 16 << 10, IdleTimeout: 60 * time.Second}
	return p, nil
}

// Serve serves until Close.
func (p *Proxy) Serve() error {
	err := p.srv.Serve(p.ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops the proxy.
func (p *Proxy) Close() error {
	err := p.srv.Close()
	for sc := p.takeIdle(); sc != nil; sc = p.takeIdle() {
		sc.conn.Close()
	}
	return err
}

// Addr is where the proxy listens.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		p.connect(w, r)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.Header.Del("Proxy-Connection")
	out.Header.Set("Proxy-Authorization", "Bearer "+p.token)
	rt := p.plain
	if !r.URL.IsAbs() {
		out.URL.Scheme, out.URL.Host, out.Host = "http", "egress", "egress"
		rt = p.origin
	}
	if r.Method == http.MethodGet && r.URL.IsAbs() && r.ContentLength == 0 {
		p.get(w, out)
		return
	}
	var resp *http.Response
	var err error
	if r.ContentLength != 0 {
		resp, err = p.exchange(out, r.URL.IsAbs())
	} else {
		resp, err = rt.RoundTrip(out)
	}
	if err != nil {
		http.Error(w, "berth egress unreachable: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	relay(w, resp)
}

// relay writes resp to the tool; the error is the copy's.
func relay(w http.ResponseWriter, resp *http.Response) error {
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	var dst io.Writer = w
	if streamed(resp) {
		// A stream (a model's server-sent events, chunked output): each
		// piece reaches the tool as it arrives. A body of known length (a
		// download, a package) is copied in large writes instead.
		dst = flushWriter{w}
	}
	buf := copyBuffers.Get().(*[]byte)
	_, err := io.CopyBuffer(dst, resp.Body, *buf)
	copyBuffers.Put(buf)
	return err
}

// copyBuffers hold the bodies relayed through userspace: a large read is
// fewer system calls per byte, and pooled it costs a small request nothing.
var copyBuffers = sync.Pool{New: func() any {
	b := make([]byte, 256<<10)
	return &b
}}

// splicedBody is the least a body must be for get to hand it to the
// kernel: below it, keeping the tool's connection is worth more.
const splicedBody = 1 << 20

// get sends a tool's GET itself, on a connection to the socket kept from
// an earlier request or a new one; a large answer of known length then
// goes to the tool by splice (the kernel moves it from the socket to the
// tool's connection, no copy through this process), and the tool's
// connection ends with it, as the answer says.
func (p *Proxy) get(w http.ResponseWriter, out *http.Request) {
	var sc *socketConn
	var resp *http.Response
	var stop func() bool
	for {
		sc = p.takeIdle()
		kept := sc != nil
		if !kept {
			d := net.Dialer{Timeout: 10 * time.Second}
			conn, err := d.DialContext(out.Context(), p.network, p.socket)
			if err != nil {
				http.Error(w, "berth egress unreachable: "+err.Error(), http.StatusBadGateway)
				return
			}
			sc = &socketConn{conn: conn, br: bufio.NewReaderSize(conn, 32<<10)}
		}
		conn := sc.conn
		stop = context.AfterFunc(out.Context(), func() { conn.Close() })
		var err error
		if resp, err = sc.send(out); err == nil {
			break
		}
		stop()
		conn.Close()
		if !kept {
			http.Error(w, "berth egress unreachable: "+err.Error(), http.StatusBadGateway)
			return
		}
		// The proxy closed a kept connection meanwhile: a GET is sent
		// again on a new one, as http.Transport does.
	}
	reusable := false
	defer func() {
		if stop() && reusable && !resp.Close {
			p.putIdle(sc)
		} else {
			sc.conn.Close()
		}
	}()
	// Whether the proxy keeps the connection to it concerns this relay
	// only; the tool's connection goes on unless the answer is spliced.
	resp.Header.Del("Connection")
	hj, hijackable := w.(http.Hijacker)
	socket, isSocket := sc.conn.(*net.UnixConn)
	if resp.ContentLength < splicedBody || resp.StatusCode < 200 || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified || !hijackable || !isSocket {
		reusable = relay(w, resp) == nil
		resp.Body.Close()
		return
	}
	// From here the body is read past resp.Body, whose Close would wait
	// for it again; the proxy ends the connection after a spliced answer.
	tool, tbuf, err := hj.Hijack()
	if err != nil {
		return
	}
	defer tool.Close()
	resp.Header.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	resp.Header.Set("Connection", "close")
	fmt.Fprintf(tbuf, "HTTP/1.1 %03d %s\r\n", resp.StatusCode, http.StatusText(resp.StatusCode))
	resp.Header.Write(tbuf)
	tbuf.WriteString("\r\n")
	held := min(int64(sc.br.Buffered()), resp.ContentLength)
	if _, err := io.CopyN(tbuf, sc.br, held); err != nil || tbuf.Flush() != nil {
		return
	}
	// A *net.TCPConn reading from a bounded *net.UnixConn splices.
	io.Copy(tool, &io.LimitedReader{R: socket, N: resp.ContentLength - held})
}

// socketConn is a connection to the run's socket that get sends requests
// on, with the reader that holds what came past the last answer's header.
type socketConn struct {
	conn net.Conn
	br   *bufio.Reader
}

func (sc *socketConn) send(out *http.Request) (*http.Response, error) {
	bw := bufio.NewWriterSize(sc.conn, 4<<10)
	err := out.WriteProxy(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		return nil, err
	}
	return readFinalResponse(sc.br, out)
}

// open says whether the proxy has neither closed the idle connection nor
// sent anything unasked on it.
func (sc *socketConn) open() bool {
	if sc.br.Buffered() > 0 {
		return false
	}
	sc.conn.SetReadDeadline(time.Now())
	_, err := sc.br.Peek(1)
	sc.conn.SetReadDeadline(time.Time{})
	return errors.Is(err, os.ErrDeadlineExceeded)
}

// takeIdle is a kept connection that is still open, or nil.
func (p *Proxy) takeIdle() *socketConn {
	for {
		select {
		case sc := <-p.idle:
			if sc.open() {
				return sc
			}
			sc.conn.Close()
		default:
			return nil
		}
	}
}

// putIdle keeps sc for the next request (as many as the transports keep:
// each holds one of the run's connection slots at the proxy).
func (p *Proxy) putIdle(sc *socketConn) {
	select {
	case p.idle <- sc:
	default:
		sc.conn.Close()
	}
}

// exchange sends a request with a body on a connection of its own and
// reads the answer while the body is still being written: the proxy may
// refuse the request before it has read the body and close the connection,
// and then the tool must get the proxy's answer, not the failed write
// (a pooled transport reports the write's broken pipe when it sees that
// first).
func (p *Proxy) exchange(out *http.Request, absolute bool) (*http.Response, error) {
	ctx := out.Context()
	d := net.Dialer{Timeout: 10 * time.Second}
	conn, err := d.DialContext(ctx, p.network, p.socket)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	// An interim 100 Continue would come before the answer: the body is
	// sent at once instead.
	out.Header.Del("Expect")
	out.Close = true
	written := make(chan error, 1)
	go func() {
		bw := bufio.NewWriterSize(conn, 32<<10)
		var err error
		if absolute {
			err = out.WriteProxy(bw)
		} else {
			err = out.Write(bw)
		}
		if err == nil {
			err = bw.Flush()
		}
		written <- err
	}()
	resp, err := readFinalResponse(bufio.NewReaderSize(conn, 32<<10), out)
	if err != nil {
		stop()
		conn.Close()
		select {
		case werr := <-written:
			if werr != nil {
				return nil, fmt.Errorf("cannot send the request: %w", werr)
			}
		default:
		}
		return nil, err
	}
	resp.Body = &connBody{ReadCloser: resp.Body, conn: conn, stop: stop}
	return resp, nil
}

// readFinalResponse reads the response to req, past any interim (1xx) one.
func readFinalResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	for {
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, nil
		}
		resp.Body.Close()
	}
}

// connBody closes the exchange's connection with the response body.
type connBody struct {
	io.ReadCloser
	conn net.Conn
	stop func() bool
}

func (b *connBody) Close() error {
	b.stop()
	err := b.ReadCloser.Close()
	b.conn.Close()
	return err
}

// flushWriter flushes after each write, so a stream flows.
type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
	return n, err
}

// streamed says a response must be passed on as it arrives: an event
// stream, or a body of unknown length.
func streamed(resp *http.Response) bool {
	if resp.ContentLength < 0 {
		return true
	}
	ct := resp.Header.Get("Content-Type")
	return strings.HasPrefix(ct, "text/event-stream")
}

// connect asks the egress proxy for the tunnel and splices it to the tool.
func (p *Proxy) connect(w http.ResponseWriter, r *http.Request) {
	up, err := net.DialTimeout(p.network, p.socket, 10*time.Second)
	if err != nil {
		http.Error(w, "berth egress unreachable: "+err.Error(), http.StatusBadGateway)
		return
	}
	fmt.Fprintf(up, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Bearer %s\r\n\r\n", r.Host, r.Host, p.token)
	br := bufio.NewReader(up)
	resp, err := http.ReadResponse(br, r)
	if err != nil {
		up.Close()
		http.Error(w, "berth egress: "+err.Error(), http.StatusBadGateway)
		return
	}
	if resp.StatusCode != http.StatusOK {
		defer up.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, io.LimitReader(resp.Body, 64<<10))
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		return
	}
	client, cbuf, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	defer client.Close()
	defer up.Close()
	io.WriteString(client, "HTTP/1.1 200 Connection Established\r\n\r\n")
	done := make(chan struct{}, 2)
	go func() {
		io.Copy(up, io.MultiReader(io.LimitReader(cbuf, int64(cbuf.Reader.Buffered())), client))
		if cw, ok := up.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		// What the reader already buffered first, then the connection
		// itself, so the copy can splice.
		if n := br.Buffered(); n > 0 {
			io.CopyN(client, br, int64(n))
		}
		io.Copy(client, up)
		if cw, ok := client.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}
