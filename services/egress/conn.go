package egress

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// bufferedBytes is what the HTTP server read past the CONNECT request: the
// first bytes of the tunnel (a TLS ClientHello sent without waiting).
func bufferedBytes(rw *bufio.ReadWriter) []byte {
	n := rw.Reader.Buffered()
	if n == 0 {
		return nil
	}
	b, _ := rw.Reader.Peek(n)
	return append([]byte(nil), b...)
}

func tlsConfig(roots *x509.CertPool) *tls.Config {
	return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
}

// limitListener lets at most cap(slots) connections be open at once. A
// connection is "pending" until it sends a request with the run's token;
// one still pending after authTimeout is closed. Pending connections cannot
// hold the slots: when every slot is taken, or more than maxUnauthenticated
// are pending, the oldest pending connection is closed — but only once it
// has been pending for authGrace, so a burst of real connections (a tool
// opening 32 downloads at once through the relay, each sending its request
// at once) is never cut, while idle ones free their slot within authGrace.
type limitListener struct {
	net.Listener
	slots              chan struct{}
	maxUnauthenticated int
	authTimeout        time.Duration
	authGrace          time.Duration

	mu      sync.Mutex
	pending []*slotConn // unauthenticated, oldest first
}

// evictOldest closes the oldest pending connection if it has been pending
// for authGrace and says so; otherwise it says how long until it will have
// (0 and false when nothing is pending).
func (l *limitListener) evictOldest() (evicted bool, wait time.Duration) {
	l.mu.Lock()
	if len(l.pending) == 0 {
		l.mu.Unlock()
		return false, 0
	}
	oldest := l.pending[0]
	age := time.Since(oldest.accepted)
	if age < l.authGrace {
		l.mu.Unlock()
		return false, l.authGrace - age
	}
	l.pending = l.pending[1:]
	l.mu.Unlock()
	oldest.Close()
	return true, 0
}

// acquire takes a slot, freeing one held by a pending connection past its
// grace when all are taken.
func (l *limitListener) acquire() {
	for {
		select {
		case l.slots <- struct{}{}:
			return
		default:
		}
		evicted, wait := l.evictOldest()
		if evicted {
			continue
		}
		if wait == 0 {
			// Every slot is held by an authenticated connection: wait for one.
			l.slots <- struct{}{}
			return
		}
		t := time.NewTimer(wait)
		select {
		case l.slots <- struct{}{}:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (l *limitListener) Accept() (net.Conn, error) {
	l.acquire()
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	sc := &slotConn{Conn: c, l: l, accepted: time.Now()}
	l.mu.Lock()
	over := len(l.pending) >= l.maxUnauthenticated
	l.pending = append(l.pending, sc)
	l.mu.Unlock()
	if over {
		l.evictOldest()
	}
	sc.timer = time.AfterFunc(l.authTimeout, func() {
		if !sc.authed.Load() {
			sc.Close()
		}
	})
	return sc, nil
}

func (l *limitListener) forget(c *slotConn) {
	l.mu.Lock()
	for i, p := range l.pending {
		if p == c {
			l.pending = append(l.pending[:i], l.pending[i+1:]...)
			break
		}
	}
	l.mu.Unlock()
}

type slotConn struct {
	net.Conn
	l        *limitListener
	accepted time.Time
	timer    *time.Timer
	authed   atomic.Bool
	once     sync.Once
}

// authenticated marks the connection as one that sent the run's token.
func (c *slotConn) authenticated() {
	if c.authed.Swap(true) {
		return
	}
	c.timer.Stop()
	c.l.forget(c)
}

// CloseWrite half-closes a tunnel's sandbox side, as the socket does.
func (c *slotConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		if c.timer != nil {
			c.timer.Stop()
		}
		c.l.forget(c)
		<-c.l.slots
	})
	return err
}

type connKey struct{}

// withConn is the http.Server's ConnContext: a request knows its connection.
func withConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

func connOf(ctx context.Context) *slotConn {
	c, _ := ctx.Value(connKey{}).(*slotConn)
	return c
}

// pipe copies between the sandbox's client and upstream (first goes
// upstream before the rest) until both directions end or nothing moved
// either way for idle; it returns the bytes sent up and down.
func pipe(client, upstream net.Conn, first []byte, idle time.Duration) (up, down int64) {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	var upN, downN atomic.Int64
	done := make(chan struct{}, 2)
	// A read returns at least this often, so bytes that moved show as
	// activity even while one copy (a splice) is still going.
	wake := min(max(idle/4, time.Millisecond), 5*time.Second)
	copyDir := func(dst, src net.Conn, pre []byte, n *atomic.Int64) {
		defer func() { done <- struct{}{} }()
		if len(pre) > 0 {
			if _, err := dst.Write(pre); err != nil {
				return
			}
			n.Add(int64(len(pre)))
		}
		// The kernel splices between the concrete sockets: no byte passes
		// through userspace, unlike a copy through a buffer.
		rawDst, rawSrc := unwrapConn(dst), unwrapConn(src)
		for {
			src.SetReadDeadline(time.Now().Add(wake))
			k, err := io.Copy(rawDst, rawSrc)
			if k > 0 {
				last.Store(time.Now().UnixNano())
				n.Add(k)
			}
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				// The end of src (err nil), or a failure either way. A
				// deadline only ever fails a read, which loses no data.
				break
			}
		}
		closeWrite(dst)
	}
	go copyDir(upstream, client, first, &upN)
	go copyDir(client, upstream, nil, &downN)
	tick := time.NewTicker(max(idle/4, time.Millisecond))
	defer tick.Stop()
	for ended := 0; ended < 2; {
		select {
		case <-done:
			ended++
		case <-tick.C:
			if time.Since(time.Unix(0, last.Load())) >= idle {
				// Idle both ways: ending it frees the run's slot.
				client.Close()
				upstream.Close()
			}
		}
	}
	return upN.Load(), downN.Load()
}

// unwrapConn is the socket under the listener's slot accounting: io.Copy
// splices only between *net.TCPConn and *net.UnixConn.
func unwrapConn(c net.Conn) net.Conn {
	if sc, ok := c.(*slotConn); ok {
		return sc.Conn
	}
	return c
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// spliceBody moves exactly n bytes from src to dst in the kernel (through
// a pipe, as io.Copy splices), which io.Copy cannot do towards a Unix
// socket with a bound. Each read and write may wait at most idle.
func spliceBody(dst, src net.Conn, n int64, idle time.Duration) (written int64, err error) {
	rawSrc, rawDst, err := rawConns(src, dst)
	if err != nil {
		return 0, err
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return 0, fmt.Errorf("cannot make a pipe to splice through: %w", err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	// src may be kept for another request: no deadline of this one stays.
	defer src.SetReadDeadline(time.Time{})
	unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, spliceChunk) // a larger pipe is fewer calls; the default works too
	const flags = unix.SPLICE_F_MOVE | unix.SPLICE_F_NONBLOCK
	for written < n {
		// The pipe is empty here, so EAGAIN means src has nothing yet.
		var inPipe int
		var serr error
		src.SetReadDeadline(time.Now().Add(idle))
		err := rawSrc.Read(func(fd uintptr) bool {
			k, e := spliceRetrying(int(fd), p[1], int(min(n-written, spliceChunk)), flags)
			if e == unix.EAGAIN {
				return false
			}
			inPipe, serr = int(k), e
			return true
		})
		if err = cmp.Or(err, serr); err != nil {
			return written, err
		}
		if inPipe == 0 {
			return written, io.ErrUnexpectedEOF
		}
		dst.SetWriteDeadline(time.Now().Add(idle))
		for inPipe > 0 {
			err := rawDst.Write(func(fd uintptr) bool {
				k, e := spliceRetrying(p[0], int(fd), inPipe, flags)
				if e == unix.EAGAIN {
					return false
				}
				if k > 0 {
					inPipe -= int(k)
					written += k
				} else if e == nil {
					e = io.ErrShortWrite
				}
				serr = e
				return true
			})
			if err = cmp.Or(err, serr); err != nil {
				return written, err
			}
		}
	}
	return written, nil
}

// spliceRetrying is one splice, repeated when a signal interrupted it (the
// poller would otherwise wait for readiness it already had).
func spliceRetrying(in, out, n, flags int) (int64, error) {
	for {
		k, err := unix.Splice(in, nil, out, nil, n, flags)
		if err != unix.EINTR {
			return k, err
		}
	}
}

// spliceChunk is the most one splice call moves: the pipe's size.
const spliceChunk = 1 << 20

func rawConns(src, dst net.Conn) (syscall.RawConn, syscall.RawConn, error) {
	sc, ok := unwrapConn(src).(syscall.Conn)
	dc, ok2 := unwrapConn(dst).(syscall.Conn)
	if !ok || !ok2 {
		return nil, nil, errors.New("cannot splice: not a socket")
	}
	rs, err := sc.SyscallConn()
	if err != nil {
		return nil, nil, err
	}
	rd, err := dc.SyscallConn()
	return rs, rd, err
}

// upstreamConn is a connection getSpliced sends tool requests on, with the
// reader that holds what came past the last answer's header.
type upstreamConn struct {
	conn  net.Conn
	limit *io.LimitedReader // bounds an answer's header
	br    *bufio.Reader
	timer *time.Timer // closes it while idle too long
}

func newUpstreamConn(c net.Conn) *upstreamConn {
	limit := &io.LimitedReader{R: c, N: 1 << 62}
	return &upstreamConn{conn: c, limit: limit, br: bufio.NewReaderSize(limit, 32<<10)}
}

// send writes out and reads its answer's header within timeout.
func (u *upstreamConn) send(out *http.Request, timeout time.Duration) (*http.Response, error) {
	u.conn.SetDeadline(time.Now().Add(timeout))
	defer u.conn.SetDeadline(time.Time{})
	if err := out.Write(u.conn); err != nil {
		return nil, err
	}
	u.limit.N = maxResponseHeader
	defer func() { u.limit.N = 1 << 62 }()
	return readFinalResponse(u.br, out)
}

// open says whether the destination has neither closed the idle
// connection nor sent anything unasked on it.
func (u *upstreamConn) open() bool {
	if u.br.Buffered() > 0 {
		return false
	}
	u.conn.SetReadDeadline(time.Now())
	_, err := u.br.Peek(1)
	u.conn.SetReadDeadline(time.Time{})
	return errors.Is(err, os.ErrDeadlineExceeded)
}

// idleConns keeps getSpliced's connections between requests by the judged
// address they reach (as http.Transport keeps its own): a tool's next
// request to the same mirror costs no new handshake.
type idleConns struct {
	mu     sync.Mutex
	byAddr map[string][]*upstreamConn
	closed bool
}

const (
	maxIdlePerAddr  = 4
	idleConnTimeout = 30 * time.Second
)

// get takes a kept connection to addr that is still open, or nil.
func (p *idleConns) get(addr string) *upstreamConn {
	for {
		p.mu.Lock()
		list := p.byAddr[addr]
		if len(list) == 0 {
			p.mu.Unlock()
			return nil
		}
		u := list[len(list)-1]
		p.byAddr[addr] = list[:len(list)-1]
		p.mu.Unlock()
		if !u.timer.Stop() {
			continue // its timer is closing it
		}
		if u.open() {
			return u
		}
		u.conn.Close()
	}
}

// put keeps u for the next request to addr, or closes it.
func (p *idleConns) put(addr string, u *upstreamConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.byAddr[addr]) >= maxIdlePerAddr {
		u.conn.Close()
		return
	}
	if p.byAddr == nil {
		p.byAddr = map[string][]*upstreamConn{}
	}
	p.byAddr[addr] = append(p.byAddr[addr], u)
	u.timer = time.AfterFunc(idleConnTimeout, func() {
		p.mu.Lock()
		list := p.byAddr[addr]
		if i := slices.Index(list, u); i >= 0 {
			p.byAddr[addr] = slices.Delete(list, i, i+1)
		}
		p.mu.Unlock()
		u.conn.Close()
	})
}

// close closes every kept connection; later ones are not kept.
func (p *idleConns) close() {
	p.mu.Lock()
	p.closed = true
	all := p.byAddr
	p.byAddr = nil
	p.mu.Unlock()
	for _, list := range all {
		for _, u := range list {
			u.timer.Stop()
			u.conn.Close()
		}
	}
}
