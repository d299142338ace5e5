package egress_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/berth-dev/berth/internal/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

var proxyBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "berth-egress-")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	proxyBinary = filepath.Join(dir, "berth-egress")
	build := exec.Command("go", "build", "-o", proxyBinary, "github.com/berth-dev/berth/cmd/berth-egress")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "cannot build berth-egress:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func launch(t *testing.T, runID, tok string, pol egress.Policy) (*egress.Proxy, string) {
	t.Helper()
	testenv.NeedRoot(t)
	nobody, err := isolation.LookupRunUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	os.Chmod(root, 0o755)
	socket := filepath.Join(root, "egress", runID, isolation.EgressSocketName)
	pol.RunID, pol.Token = runID, tok
	p, err := egress.Launch(context.Background(), pol, egress.LaunchOptions{Logger: quiet, Binary: proxyBinary, User: nobody, Client: nobody, Socket: socket})
	if err != nil {
		t.Fatal(err)
	}
	return p, socket
}

func TestTheProxyRunsUnprivilegedAndItsTokenEndsWithTheRun(t *testing.T) {
	t.Parallel()
	oa := fakeOpenAI(t)
	p, socket := launch(t, "run1", token, egress.Policy{Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: oa.URL + "/v1", Model: "m", Key: openKey}}})
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "Uid:") && strings.Fields(line)[1] == "0" {
			t.Fatalf("the proxy runs as root: %s", line)
		}
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.Pid()))
	environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.Pid()))
	if strings.Contains(string(cmdline)+string(environ), openKey) {
		t.Fatal("the key is in the proxy's argv or environment")
	}
	fi, err := os.Stat(socket)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode = %v, %v; want 0600 for the run user only", fi, err)
	}
	px := proxy{socket: socket}
	if code, body := do(t, px.origin(token), "POST", "http://egress/providers/openai/chat/completions", `{"model":"m"}`); code != 200 {
		t.Fatalf("provider call through the proxy process: %d %q", code, body)
	}
	decisions, _ := p.Stop()
	if len(decisions) != 1 || !decisions[0].Allowed {
		t.Fatalf("decisions = %+v, want the one allowed provider call", decisions)
	}
	if _, err := net.Dial("unix", socket); err == nil {
		t.Fatal("the run's socket still answers after the run ended")
	}
	if _, err := os.Stat(filepath.Dir(socket)); !os.IsNotExist(err) {
		t.Fatalf("the run's egress directory is left behind: %v", err)
	}
}

func TestARunCannotUseAnotherRunsSocket(t *testing.T) {
	t.Parallel()
	oa := fakeOpenAI(t)
	pol := egress.Policy{Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: oa.URL + "/v1", Model: "m", Key: openKey}}}
	a, _ := launch(t, "runa", "token-of-run-a-0123456789", pol)
	defer a.Stop()
	b, socketB := launch(t, "runb", "token-of-run-b-0123456789", pol)
	defer b.Stop()
	code, body := do(t, proxy{socket: socketB}.origin("token-of-run-a-0123456789"), "POST", "http://egress/providers/openai/chat/completions", `{"model":"m"}`)
	if code != http.StatusProxyAuthRequired {
		t.Fatalf("run a's token on run b's socket: %d %q, want 407", code, body)
	}
}

func TestTheProxyIsNeverStartedAsRoot(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	socket := filepath.Join(t.TempDir(), "egress", "r1", isolation.EgressSocketName)
	_, err := egress.Launch(context.Background(), egress.Policy{RunID: "r1", Token: token}, egress.LaunchOptions{Logger: quiet, Binary: proxyBinary, Socket: socket})
	if err == nil || !strings.Contains(err.Error(), "refusing to run it as root") {
		t.Fatalf("Launch without a user as root = %v, want a refusal", err)
	}
	if _, err := os.Stat(filepath.Dir(socket)); !os.IsNotExist(err) {
		t.Errorf("a refused launch left its directory: %v", err)
	}
}

func TestDecisionLogsNeverCarryTheKeyOrTheToken(t *testing.T) {
	t.Parallel()
	oa := fakeOpenAI(t)
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p := startProxy(t, egress.Policy{RunID: "r1", Providers: []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: oa.URL + "/v1", Model: "m", Key: openKey}}}, egress.Options{Logger: log})
	do(t, p.origin(token), "POST", "http://egress/providers/openai/chat/completions", `{"model":"m"}`)
	do(t, p.origin("wrong-token-0123456789"), "POST", "http://egress/providers/openai/chat/completions", `{"model":"m"}`)
	p.srv.Close()
	mu.Lock()
	defer mu.Unlock()
	out := logs.String()
	if !strings.Contains(out, "run_id=r1") || !strings.Contains(out, "allowed=true") {
		t.Fatalf("decisions were not logged with run_id: %s", out)
	}
	for _, secret := range []string{openKey, token, "wrong-token-0123456789"} {
		if strings.Contains(out, secret) {
			t.Fatalf("the log holds a secret: %s", out)
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
