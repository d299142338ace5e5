package e2e

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

const caTestSecret = "ci_token_e2e_SECRET_4711"

// gitSHA is the one ref the fake git servers advertise.
const gitSHA = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"

// A container run with a [[egress.secrets]] host trusts the run's CA through
// the bundle at /run/berth-egress/ca.pem: curl, git and Python's requests
// reach the intercepted host (which gets the secret) and a host that is
// not intercepted (which does not), both over TLS the tools verify.
func TestContainerToolsVerifyTLSThroughTheRunsCABundle(t *testing.T) {
	t.Parallel()
	testdocker.Engine(t)
	testenv.NeedRoot(t)
	_, err := exec.LookPath("systemd-socket-activate")
	testenv.Need(t, err == nil, "systemd-socket-activate is not installed")
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	// "vm" is 127.0.0.1 in /etc/hosts: a name NO_PROXY does not keep
	// local, so tools take the proxy there; 127.0.0.3 likewise.
	caPEM, leaf := testCA(t, "vm", "127.0.0.3")
	caFile := filepath.Join(baseDir, fmt.Sprintf("ca-bundle-test-%d.pem", os.Getpid()))
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil { // the egress user reads it
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(caFile) })
	secretHost := newGitServer(t, "127.0.0.1:0", leaf, "Bearer "+caTestSecret)
	plainHost := newGitServer(t, "127.0.0.3:0", leaf, "")
	secretAddr, plainAddr := "vm:"+secretHost.port, "127.0.0.3:"+plainHost.port

	gpt := newFakeOpenAI(t)
	sink := newReplySink(t)
	cfg := fmt.Sprintf(`[providers]
primary = "gpt"

[providers.gpt]
kind = "openai"
base_url = %q
api_key_env = "E2E_FAKE_KEY"
model = "gpt-e2e"

[[egress.secrets]]
name = "ci"
env = "E2E_CA_SECRET"
hosts = ["vm"]
header = "Authorization"
format = "Bearer {}"

[[agents]]
id = "boxed"
max_iterations = 4
[agents.egress]
allow = [%q, %q]
[agents.container_mode]
enabled = true
network = "none"
timeout_seconds = 300
[agents.image_config]
enabled = true
packages = ["curl", "git", "python3-requests", "ca-certificates"]

[intake]
default_agent = "boxed"

[[connectors]]
id = "hooks"
type = "webhook"
secret = %q
reply_url = %q

[scheduler]
default_timeout_seconds = 300
run_as = "nobody"
egress_user = "daemon"
agent_binary = %q
`, gpt.srv.URL+"/v1", secretAddr, plainAddr, secret, sink.srv.URL+"/replies", filepath.Join(binDir, "berth-agent"))
	env := []string{"E2E_FAKE_KEY=" + fakeKey, "E2E_CA_SECRET=" + caTestSecret, "SSL_CERT_FILE=" + caFile}
	s := launchShort(t, sink, cfg, env, fakeKey, caTestSecret)

	// Each tool prints a marker line per host; a TLS failure prints the
	// tool's error instead.
	script := strings.Join([]string{
		"ls -l /run/berth-egress/ca.pem",
		"curl -sS https://" + secretAddr + "/curl; echo",
		"curl -sS https://" + plainAddr + "/curl; echo",
		"git ls-remote https://" + secretAddr + "/repo.git 2>&1 | sed 's/^/git-secret /'",
		"git ls-remote https://" + plainAddr + "/repo.git 2>&1 | sed 's/^/git-plain /'",
		`python3 -c 'import requests, sys; [print(requests.get(u, timeout=30).text) for u in sys.argv[1:]]' https://` + secretAddr + "/requests https://" + plainAddr + "/requests 2>&1",
	}, "; ")
	id := s.mustPost(t, "general", "run "+script)
	// The first run builds the agent's image (Debian packages): minutes.
	reply := s.sink.wait(t, 20*time.Minute, id)[id]
	out := text(reply)
	if reply["state"] != "succeeded" {
		t.Fatalf("state %v, error %v, reply %q", reply["state"], reply["error"], out)
	}
	for _, want := range []string{
		"secret-host /curl", "plain-host /curl",
		// The reply quotes the tool's output as JSON: a tab reads \t.
		"git-secret " + gitSHA + `\trefs/heads/main`, "git-plain " + gitSHA + `\trefs/heads/main`,
		"secret-host /requests", "plain-host /requests",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the tools' output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, caTestSecret) {
		t.Error("the secret reached the sandbox")
	}
	if got := plainHost.authorizations(); len(got) == 0 || strings.Join(got, "") != "" {
		t.Errorf("the host that is not intercepted got Authorization %q; want requests without one", got)
	}
	if got := secretHost.refused(); len(got) > 0 {
		t.Errorf("the intercepted host got requests without the secret: %q", got)
	}
	// The run's record counts every decision by host.
	runID, _ := reply["run_id"].(string)
	show, err := s.berthctl(t, "runs", "show", runID)
	if err != nil {
		t.Fatalf("berthctl runs show: %v\n%s", err, show)
	}
	for _, want := range []string{"\negress counts: ", "\n  vm ", "\n  127.0.0.3 "} {
		if !strings.Contains(show, want) {
			t.Errorf("runs show lacks %q:\n%s", want, show)
		}
	}
}

// gitServer is an HTTPS upstream that answers each path with its name and
// the path, and git's dumb protocol with one ref; want, when set, is the
// Authorization it requires.
type gitServer struct {
	port string
	mu   sync.Mutex
	auth []string
	bad  []string
}

func newGitServer(t *testing.T, addr string, leaf tls.Certificate, want string) *gitServer {
	t.Helper()
	g := &gitServer{}
	name := "plain-host"
	if want != "" {
		name = "secret-host"
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.auth = append(g.auth, r.Header.Get("Authorization"))
		if want != "" && r.Header.Get("Authorization") != want {
			g.bad = append(g.bad, r.URL.Path)
			g.mu.Unlock()
			http.Error(w, "no secret", http.StatusUnauthorized)
			return
		}
		g.mu.Unlock()
		switch r.URL.Path {
		case "/repo.git/info/refs":
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, gitSHA+"\trefs/heads/main\n")
		case "/repo.git/HEAD":
			io.WriteString(w, "ref: refs/heads/main\n")
		default:
			io.WriteString(w, name+" "+r.URL.Path)
		}
	}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener.Close()
	srv.Listener = ln
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	_, g.port, _ = net.SplitHostPort(ln.Addr().String())
	return g
}

func (g *gitServer) authorizations() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.auth...)
}

func (g *gitServer) refused() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.bad...)
}
