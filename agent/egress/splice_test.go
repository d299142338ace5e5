package egress_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	agentegress "github.com/berth-dev/berth/agent/egress"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

// relaySocketEnv names the socket TestHelperRelayProcess relays to.
const relaySocketEnv = "BERTH_TEST_RELAY_SOCKET"

// TestHelperRelayProcess is the relay alone in a process of its own, for
// TestLargeTransfersAreSplicedThroughTheRelay: it prints its address and
// serves until its stdin closes. Run as a test, it does nothing.
func TestHelperRelayProcess(t *testing.T) {
	socket := os.Getenv(relaySocketEnv)
	if socket == "" {
		return
	}
	p, err := agentegress.Listen(agentproto.Egress{ProxyAddr: "127.0.0.1:0", Socket: socket, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve()
	fmt.Println(p.Addr())
	io.Copy(io.Discard, os.Stdin)
	p.Close()
}

// startRelayProcess runs the relay to socket in a child process.
func startRelayProcess(t *testing.T, socket string) (addr string, pid int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRelayProcess$")
	cmd.Env = append(os.Environ(), relaySocketEnv+"="+socket)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("the relay process did not start: %v", err)
	}
	return strings.TrimSpace(line), cmd.Process.Pid
}

// readBytes is how many bytes a process has read with read(2) and its
// kind (/proc/<pid>/io rchar); what the kernel splices is not among them.
func readBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
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

// A tool's large download (forwarded or tunnelled) and its large upload
// through a tunnel pass the relay in the kernel: the relay never reads
// their bytes into its own memory.
func TestLargeTransfersAreSplicedThroughTheRelay(t *testing.T) {
	t.Parallel()
	const size = 16 << 20
	body := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	want := sha256.Sum256(body)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			got, _ := io.ReadAll(r.Body)
			sum := sha256.Sum256(got)
			w.Write(sum[:])
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.Write(body)
	})
	plain := httptest.NewServer(h)
	t.Cleanup(plain.Close)
	secure := httptest.NewTLSServer(h)
	t.Cleanup(secure.Close)
	var allow []isolation.EgressRule
	for _, up := range []*httptest.Server{plain, secure} {
		rule, err := isolation.ParseEgressRule(up.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		allow = append(allow, rule)
	}
	srv, err := egress.NewServer(egress.Policy{RunID: "r1", Token: token, Allow: allow}, egress.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	addr, pid := startRelayProcess(t, socket)
	tool := &http.Client{Transport: &http.Transport{
		Proxy:           http.ProxyURL(&url.URL{Scheme: "http", Host: addr}),
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}

	for _, tc := range []struct{ name, method, url string }{
		{"Forwarded_download", "GET", plain.URL + "/file"},
		{"Tunnelled_download", "GET", secure.URL + "/file"},
		{"Tunnelled_upload", "PUT", secure.URL + "/file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := readBytes(t, pid)
			var reqBody io.Reader
			if tc.method == "PUT" {
				reqBody = bytes.NewReader(body)
			}
			req, _ := http.NewRequest(tc.method, tc.url, reqBody)
			resp, err := tool.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if tc.method == "GET" {
				sum := sha256.Sum256(got)
				got = sum[:]
			}
			if err != nil || resp.StatusCode != 200 || !bytes.Equal(got, want[:]) {
				t.Fatalf("%s: status %d, %v", tc.method, resp.StatusCode, err)
			}
			if read := readBytes(t, pid) - before; read > size/8 {
				t.Fatalf("the relay read %d bytes of a %d-byte transfer itself; want it spliced", read, size)
			}
		})
	}
}

// acceptCounter counts the connections a listener accepted.
type acceptCounter struct {
	net.Listener
	accepted atomic.Int32
}

func (l *acceptCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// A tool's small GETs one after another reach the run's socket on one
// connection: each new one would be one more the proxy holds
// unauthenticated for a moment, of the few it allows.
func TestAToolsGETsShareOneConnectionToTheSocket(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/large" {
			w.Header().Set("Content-Length", strconv.Itoa(4<<20))
			w.Write(bytes.Repeat([]byte("x"), 4<<20))
			return
		}
		io.WriteString(w, "small")
	}))
	t.Cleanup(up.Close)
	rule, err := isolation.ParseEgressRule(up.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := egress.NewServer(egress.Policy{RunID: "r1", Token: token, Allow: []isolation.EgressRule{rule}}, egress.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	conns := &acceptCounter{Listener: ln}
	go srv.Serve(conns)
	t.Cleanup(func() { srv.Close() })
	relay, err := agentegress.Listen(agentproto.Egress{ProxyAddr: "127.0.0.1:0", Socket: socket, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	go relay.Serve()
	t.Cleanup(func() { relay.Close() })
	tool := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: relay.Addr()})}}
	for _, path := range []string{"/a", "/b", "/c"} {
		resp, err := tool.Get(up.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "small" {
			t.Fatalf("GET %s: %d %q", path, resp.StatusCode, b)
		}
	}
	if n := conns.accepted.Load(); n != 1 {
		t.Fatalf("three GETs one after another opened %d connections to the socket, want 1", n)
	}
	// After a spliced answer, which ends its connection, the next GET
	// dials again and works.
	for _, path := range []string{"/large", "/d"} {
		resp, err := tool.Get(up.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || path == "/d" && string(b) != "small" || path == "/large" && len(b) != 4<<20 {
			t.Fatalf("GET %s: %d, %d bytes", path, resp.StatusCode, len(b))
		}
	}
}
