package egress_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/services/egress"
)

// readEOF waits for the proxy to close conn, failing after within.
func readEOF(t *testing.T, conn net.Conn, r io.Reader, within time.Duration) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(within))
	_, err := io.Copy(io.Discard, r)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the proxy kept the connection open for %s", within)
	}
}

// Provider bodies held at once are bounded across connections: a run
// cannot make the proxy buffer 32 × 16 MiB.
func TestProviderBodiesShareOneBufferBudget(t *testing.T) {
	t.Parallel()
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	model := newRecordingUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if strings.Contains(r.Header.Get("User-Agent"), "hold") {
			arrived <- struct{}{}
			<-release
		}
		io.WriteString(w, "{}")
	})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // before the upstream closes, which waits for its handlers
	p := startProxy(t, egress.Policy{RunID: "r1", Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: model.URL + "/v1", Model: "m", Key: openKey}}},
		egress.Options{MaxProviderBuffer: 1 << 10})
	body := `{"model":"m","pad":"` + strings.Repeat("x", 600) + `"}`
	first := make(chan int, 1)
	go func() {
		code, _, _ := sendRaw(p.socket, "POST", "/providers/openai/chat/completions", body, http.Header{"User-Agent": {"hold"}})
		first <- code
	}()
	<-arrived // the first call's body is held while its provider thinks
	code, answer := rawRequest(t, p.socket, "POST", "/providers/openai/chat/completions", body, nil)
	if code != http.StatusServiceUnavailable || !strings.Contains(answer, "1024 bytes of request bodies at once") {
		t.Fatalf("a second body over the shared budget: %d %q, want 503", code, answer)
	}
	free()
	if code := <-first; code != 200 {
		t.Fatalf("the first call: %d", code)
	}
	if code, answer := rawRequest(t, p.socket, "POST", "/providers/openai/chat/completions", body, nil); code != 200 {
		t.Fatalf("a call once the budget is free again: %d %q", code, answer)
	}
}

// A tunnel through which nothing moved either way for the idle timeout is
// closed, freeing the run's slot.
func TestAnIdleTunnelIsClosed(t *testing.T) {
	t.Parallel()
	target := echoServer(t)
	p := startProxy(t, egress.Policy{RunID: "r1", Allow: rules(t, target)}, egress.Options{TunnelIdleTimeout: 300 * time.Millisecond})
	tn := dialTunnel(t, p.socket, target)
	tn.established(t)
	readEOF(t, tn.conn, tn.r, 20*time.Second)
}

// A connection that never sends a request with the run's token is closed
// after the authentication timeout, even while it keeps sending others.
func TestAConnectionThatNeverAuthenticatesIsClosed(t *testing.T) {
	t.Parallel()
	p := startProxy(t, egress.Policy{RunID: "r1"}, egress.Options{AuthTimeout: 300 * time.Millisecond})
	conn, err := net.Dial("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	fmt.Fprintf(conn, "GET http://x.example/ HTTP/1.1\r\nHost: x.example\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusProxyAuthRequired {
		t.Fatalf("got %d, want 407", resp.StatusCode)
	}
	readEOF(t, conn, br, 20*time.Second)
}

// Idle unauthenticated connections cannot hold every slot: with all 32
// taken by them, the 33rd connection is served at once, not after them.
func TestIdleUnauthenticatedConnectionsCannotHoldAllSlots(t *testing.T) {
	t.Parallel()
	// An hour: what frees the slots is the limit, not the timeout.
	p := startProxy(t, egress.Policy{RunID: "r1"}, egress.Options{AuthTimeout: time.Hour})
	for range 32 {
		c, err := net.Dial("unix", p.socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	conn, err := net.Dial("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Under Go's own 10 s header timeout, which would free them too.
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET http://x.example/ HTTP/1.1\r\nHost: x.example\r\nProxy-Authorization: Bearer %s\r\n\r\n", token)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the 33rd connection was not served: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("got %d, want the proxy's 403", resp.StatusCode)
	}
}

// A tool that opens many connections at once (npm, pip, a parallel
// download through the relay) loses none of them to the limit on
// unauthenticated connections: each sends its request at once, within the
// grace a new connection has.
func TestABurstOfRealConnectionsIsNotCutByTheUnauthenticatedLimit(t *testing.T) {
	t.Parallel()
	p := startProxy(t, egress.Policy{RunID: "r1"}, egress.Options{})
	var conns []net.Conn
	for range 32 {
		c, err := net.Dial("unix", p.socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
	}
	for i, c := range conns {
		c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := fmt.Fprintf(c, "GET http://x.example/ HTTP/1.1\r\nHost: x.example\r\nProxy-Authorization: Bearer %s\r\n\r\n", token); err != nil {
			t.Fatalf("connection %d of the burst was cut before its request: %v", i, err)
		}
	}
	for i, c := range conns {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("connection %d of the burst got no answer: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("connection %d: got %d, want the proxy's 403", i, resp.StatusCode)
		}
	}
}

// A refused request's body is read before the refusal is sent, so the
// sandbox always gets the proxy's answer, not a broken pipe.
func TestARefusedCallsBodyIsReadSoTheSandboxGetsTheReason(t *testing.T) {
	t.Parallel()
	p := startProxy(t, egress.Policy{RunID: "r1", Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: "http://127.0.0.1:9/v1", Model: "m", Key: openKey}}}, egress.Options{})
	conn, err := net.Dial("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := strings.Repeat("x", 4<<20) // far more than a socket buffer holds
	fmt.Fprintf(conn, "POST /providers/openai/files HTTP/1.1\r\nHost: egress\r\nProxy-Authorization: Bearer %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n", token, len(body))
	if _, err := io.WriteString(conn, body); err != nil {
		t.Fatalf("sending the body of a refused call: %v (the proxy stopped reading)", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("got %d, want the proxy's 403", resp.StatusCode)
	}
}
