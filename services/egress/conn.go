package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"sync"
	"sync/atomic"
	"time"
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

// limitListener lets at most cap(slots) connections be open at once (the
// next Accept waits for one to close), of which at most
// maxUnauthenticated have not yet sent a request with the run's token: one
// more closes the oldest of those, so idle connections cannot hold the
// slots. A connection still unauthenticated after authTimeout is closed.
type limitListener struct {
	net.Listener
	slots              chan struct{}
	maxUnauthenticated int
	authTimeout        time.Duration

	mu      sync.Mutex
	pending []*slotConn // unauthenticated, oldest first
}

func (l *limitListener) Accept() (net.Conn, error) {
	l.slots <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	sc := &slotConn{Conn: c, l: l}
	var evict *slotConn
	l.mu.Lock()
	if len(l.pending) >= l.maxUnauthenticated {
		evict, l.pending = l.pending[0], l.pending[1:]
	}
	l.pending = append(l.pending, sc)
	l.mu.Unlock()
	if evict != nil {
		evict.Close()
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
	l      *limitListener
	timer  *time.Timer
	authed atomic.Bool
	once   sync.Once
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
	copyDir := func(dst, src net.Conn, pre []byte, n *atomic.Int64) {
		defer func() { done <- struct{}{} }()
		if len(pre) > 0 {
			if _, err := dst.Write(pre); err != nil {
				return
			}
			n.Add(int64(len(pre)))
		}
		buf := make([]byte, 32<<10)
		for {
			k, err := src.Read(buf)
			if k > 0 {
				last.Store(time.Now().UnixNano())
				if _, werr := dst.Write(buf[:k]); werr != nil {
					break
				}
				n.Add(int64(k))
			}
			if err != nil {
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

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}
