package runprep

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runSocket is a run's egress socket that answers who it is.
func runSocket(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s saw %s %s", name, r.Method, r.Header.Get("Proxy-Authorization"))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return path
}

func ask(t *testing.T, addr, token string) (int, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	auth := ""
	if token != "" {
		auth = "Proxy-Authorization: Bearer " + token + "\r\n"
	}
	fmt.Fprintf(c, "GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n%sConnection: close\r\n\r\n", auth)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// The router hands a connection to the run whose token it carries, and
// refuses one without a live run's token; a run taken off is gone.
func TestKubernetesRouterPicksTheRunByItsToken(t *testing.T) {
	p := &Preparer{log: slog.Default()}
	r, err := p.kubeRouterFor("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := r.ln.Addr().String()
	t.Cleanup(func() { r.ln.Close() })
	offA := r.add(runSocket(t, "run a"), "token-of-a", "agent-token-of-a")
	r.add(runSocket(t, "run b"), "token-of-b")
	if code, body := ask(t, addr, "token-of-a"); code != 200 || body != "run a saw GET Bearer token-of-a" {
		t.Errorf("run a's token: %d %q", code, body)
	}
	// berth-agent's own channel (web_search, MCP servers) reaches the same
	// run's proxy with its own token.
	if code, body := ask(t, addr, "agent-token-of-a"); code != 200 || body != "run a saw GET Bearer agent-token-of-a" {
		t.Errorf("run a's agent token: %d %q", code, body)
	}
	if code, body := ask(t, addr, "token-of-b"); code != 200 || !strings.HasPrefix(body, "run b saw") {
		t.Errorf("run b's token: %d %q", code, body)
	}
	for _, tok := range []string{"", "guessed", "token-of-"} {
		if code, body := ask(t, addr, tok); code != http.StatusProxyAuthRequired || strings.Contains(body, "saw") {
			t.Errorf("token %q: %d %q, want 407 and no run", tok, code, body)
		}
	}
	offA()
	for _, tok := range []string{"token-of-a", "agent-token-of-a"} {
		if code, _ := ask(t, addr, tok); code != http.StatusProxyAuthRequired {
			t.Errorf("a finished run's token %q: %d, want 407", tok, code)
		}
	}
}
