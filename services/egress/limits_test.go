package egress_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

// countingListener counts the connections the proxy took from the socket.
type countingListener struct {
	net.Listener
	accepted atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// echoServer is an upstream that sends back what it reads.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// tunnel is one sandbox connection holding a CONNECT tunnel open.
type tunnel struct {
	conn net.Conn
	r    *bufio.Reader
}

func dialTunnel(t *testing.T, socket, target string) tunnel {
	t.Helper()
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Bearer %s\r\n\r\n", target, target, token)
	return tunnel{conn: conn, r: bufio.NewReader(conn)}
}

// established waits for the proxy's answer to the CONNECT and checks that
// bytes travel through the tunnel.
func (tn tunnel) established(t *testing.T) {
	t.Helper()
	resp, err := http.ReadResponse(tn.r, nil)
	if err != nil {
		t.Fatalf("no answer to CONNECT: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT got %d, want 200", resp.StatusCode)
	}
	tn.echo(t)
}

func (tn tunnel) echo(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(tn.conn, "ping\n"); err != nil {
		t.Fatal(err)
	}
	line, err := tn.r.ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Fatalf("tunnel echoed %q, %v", line, err)
	}
}

// A run that opens more connections than its limit gets the extra ones
// served only as earlier ones close: it cannot pile up connections (and
// upstream dials) at the proxy.
func TestARunsConnectionsBeyondItsLimitWaitUntilOneCloses(t *testing.T) {
	t.Parallel()
	target := echoServer(t)
	rule, err := isolation.ParseEgressRule(target)
	if err != nil {
		t.Fatal(err)
	}
	const limit = 2
	srv, err := egress.NewServer(egress.Policy{RunID: "r1", Token: token, Allow: []isolation.EgressRule{rule}}, egress.Options{MaxConns: limit, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	socket := filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	counted := &countingListener{Listener: ln}
	go srv.Serve(counted)

	open := make([]tunnel, limit)
	for i := range open {
		open[i] = dialTunnel(t, socket, target)
		open[i].established(t)
	}
	// One over the limit: its CONNECT is written and waits in the socket's
	// backlog.
	extra := dialTunnel(t, socket, target)
	answered := make(chan error, 1)
	go func() {
		resp, err := http.ReadResponse(extra.r, nil)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("CONNECT got %d, want 200", resp.StatusCode)
		}
		answered <- err
	}()
	// The open tunnels still carry traffic (the proxy is not stuck), and
	// the extra connection has not been taken.
	for _, tn := range open {
		tn.echo(t)
	}
	if n := counted.accepted.Load(); n != limit {
		t.Fatalf("the proxy took %d connections with %d open, want at most %d", n, limit, limit)
	}
	select {
	case err := <-answered:
		t.Fatalf("the connection over the limit was served while %d were open (%v)", limit, err)
	default:
	}

	open[0].conn.Close()
	if err := <-answered; err != nil {
		t.Fatalf("the waiting connection after one closed: %v", err)
	}
	extra.echo(t)
	if n := counted.accepted.Load(); n != limit+1 {
		t.Errorf("the proxy took %d connections, want %d", n, limit+1)
	}
}

// A request whose header is over the bound gets 431 and reaches nothing,
// whichever form it takes (tunnel, plain HTTP, a provider call); one just
// under the bound is decided as usual.
func TestHeadersOverTheBoundAreRefusedInEveryForm(t *testing.T) {
	t.Parallel()
	target := echoServer(t)
	rule, err := isolation.ParseEgressRule(target)
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, egress.Policy{RunID: "r1", Allow: []isolation.EgressRule{rule}}, egress.Options{MaxHeaderBytes: 4 << 10})
	tests := []struct {
		name, request string
		padding       int
		code          int
	}{
		{"A_CONNECT_with_a_huge_header_is_refused", "CONNECT " + target + " HTTP/1.1\r\nHost: " + target, 20 << 10, http.StatusRequestHeaderFieldsTooLarge},
		{"A_provider_call_with_a_huge_header_is_refused", "POST /providers/openai/v1/chat/completions HTTP/1.1\r\nHost: egress", 20 << 10, http.StatusRequestHeaderFieldsTooLarge},
		{"A_CONNECT_with_a_header_under_the_bound_is_tunnelled", "CONNECT " + target + " HTTP/1.1\r\nHost: " + target, 1 << 10, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conn, err := net.Dial("unix", p.socket)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "%s\r\nProxy-Authorization: Bearer %s\r\nX-Pad: %s\r\n\r\n", tt.request, token, strings.Repeat("a", tt.padding))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.code {
				t.Fatalf("got %d, want %d", resp.StatusCode, tt.code)
			}
		})
	}
}
