package egress_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/services/egress"
)

// readBytes is how many bytes a process has read with read(2) and its
// kind (/proc/<pid>/io rchar); what the kernel splices is not among them.
func readBytes(t *testing.T, pid int) int64 {
	t.Helper()
	io, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(io), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no rchar in /proc/%d/io", pid)
	return 0
}

// A download's body goes from the destination to the sandbox in the
// kernel, through a tunnel and as a forwarded request's answer alike: the
// proxy process never reads it into its own memory, which is what made it
// slower than direct.
func TestALargeDownloadIsSplicedNotCopiedThroughTheProxy(t *testing.T) {
	t.Parallel()
	const size = 16 << 20
	body := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	want := sha256.Sum256(body)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.Write(body)
	})
	plain := httptest.NewServer(h)
	t.Cleanup(plain.Close)
	secure := httptest.NewTLSServer(h)
	t.Cleanup(secure.Close)
	p, socket := launch(t, "splice", token, egress.Policy{Allow: rules(t, plain.Listener.Addr().String(), secure.Listener.Addr().String())})
	t.Cleanup(func() { p.Stop() })
	client := proxy{socket: socket}.client(token)

	for _, tc := range []struct{ name, url string }{
		{"Forwarded_plain_HTTP", plain.URL + "/file"},
		{"CONNECT_tunnel", secure.URL + "/file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := readBytes(t, p.Pid())
			resp, err := client.Get(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || sha256.Sum256(got) != want {
				t.Fatalf("download: status %d, %d of %d bytes, %v", resp.StatusCode, len(got), size, err)
			}
			if read := readBytes(t, p.Pid()) - before; read > size/8 {
				t.Fatalf("the proxy read %d bytes of a %d-byte download itself; want it spliced", read, size)
			}
		})
	}
}

// A forwarded answer too small to splice, or of unknown length, is relayed
// as it arrives.
func TestSmallAndStreamedAnswersAreForwardedAsBefore(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			io.WriteString(w, "first\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		io.WriteString(w, "small")
	}))
	t.Cleanup(up.Close)
	p := startProxy(t, egress.Policy{RunID: "r1", Allow: rules(t, up.Listener.Addr().String())}, egress.Options{})
	client := p.client(token)
	for range 3 {
		if code, body := do(t, client, "GET", up.URL+"/small", ""); code != 200 || body != "small" {
			t.Fatalf("small answer: %d %q", code, body)
		}
	}
	resp, err := client.Get(up.URL + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line := make([]byte, 6)
	done := make(chan error, 1)
	go func() { _, err := io.ReadFull(resp.Body, line); done <- err }()
	select {
	case err := <-done:
		if err != nil || string(line) != "first\n" {
			t.Fatalf("stream: %q, %v", line, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the stream's first line did not arrive while the upstream held the rest")
	}
}

// A tunnel whose bytes keep coming (one way only, a slow download) is not
// idle, although the kernel moves them without the proxy reading each.
func TestATunnelThatKeepsMovingIsNotClosedAsIdle(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		for {
			if _, err := c.Write([]byte("x")); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	const idle = time.Second
	p := startProxy(t, egress.Policy{RunID: "r1", Allow: rules(t, ln.Addr().String())}, egress.Options{TunnelIdleTimeout: idle})
	tn := dialTunnel(t, p.socket, ln.Addr().String())
	if resp, err := http.ReadResponse(tn.r, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	// Three idle timeouts' worth of bytes, each arriving well within one.
	tn.conn.SetReadDeadline(time.Now().Add(time.Minute))
	if n, err := io.CopyN(io.Discard, tn.r, int64(3*idle/(50*time.Millisecond))); err != nil {
		t.Fatalf("the tunnel ended after %d bytes while they kept coming: %v", n, err)
	}
}

// A tool's requests one after another to the same destination go on one
// upstream connection, as they did on http.Transport's: an apt run against
// a mirror pays no handshake per file.
func TestAToolsRequestsToOneDestinationShareItsConnection(t *testing.T) {
	t.Parallel()
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/large" {
			w.Header().Set("Content-Length", strconv.Itoa(4<<20))
			w.Write(bytes.Repeat([]byte("x"), 4<<20))
			return
		}
		io.WriteString(w, "small")
	}))
	conns := &countingListener{Listener: up.Listener}
	up.Listener = conns
	up.Start()
	t.Cleanup(up.Close)
	p := startProxy(t, egress.Policy{RunID: "r1", Allow: rules(t, up.Listener.Addr().String())}, egress.Options{})
	client := p.client(token)
	for _, path := range []string{"/a", "/large", "/b", "/large", "/c"} {
		code, body := do(t, client, "GET", up.URL+path, "")
		if code != 200 || path != "/large" && body != "small" || path == "/large" && len(body) != 4<<20 {
			t.Fatalf("GET %s: %d, %d bytes", path, code, len(body))
		}
	}
	if n := conns.accepted.Load(); n != 1 {
		t.Fatalf("five requests one after another opened %d upstream connections, want 1", n)
	}
}

// A sandbox that hangs up while its GET waits for an answer ends the
// upstream exchange too, rather than holding it for the response timeout.
func TestASandboxHangingUpEndsItsPendingGET(t *testing.T) {
	t.Parallel()
	arrived, ended := make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-r.Context().Done() // the proxy closed its connection
		close(ended)
	}))
	t.Cleanup(up.Close)
	p := startProxy(t, egress.Policy{RunID: "r1", Allow: rules(t, up.Listener.Addr().String())}, egress.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", up.URL+"/slow", nil)
	go func() {
		<-arrived
		cancel()
	}()
	if resp, err := p.client(token).Do(req); err == nil {
		resp.Body.Close()
	}
	select {
	case <-ended:
	case <-time.After(20 * time.Second):
		t.Fatal("the upstream exchange went on after the sandbox hung up")
	}
}
