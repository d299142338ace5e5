package runprep

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/gitforge"
	"github.com/berth-dev/berth/isolation"
)

// sharedDir is a directory [scheduler] egress_user can read files in.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "berth-runprep-git-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A run whose agent has only a git rule (no allow rule, no secret) gets a
// proxy that intercepts the forge with the run's CA, lets git's requests
// for the rule's repository through with a token it minted for the run,
// refuses another repository, and revokes the token when the run ends.
func TestGitRulesFromBerthTomlReachTheRunsProxy(t *testing.T) {
	t.Parallel()
	forge := gitforge.New(t, gitforge.Options{})
	forge.Seed("acme/web")
	forge.Seed("acme/other")
	shared := sharedDir(t)
	roots := filepath.Join(shared, "forge-roots.pem")
	key := filepath.Join(shared, "acme-bot.pem")
	if err := os.WriteFile(roots, forge.RootsPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, []byte(forge.App.PrivateKeyPEM()), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := loadConfig(t, fmt.Sprintf(`
[scheduler]
run_as = "nobody"
agent_binary = "/nonexistent/berth-agent"
egress_binary = %q
egress_user = "daemon"
allow_rlimit_fallback = true

[agent_defaults]
workspace_quota = "0"

[[egress.github_apps]]
name            = "acme-bot"
app_id          = %d
installation_id = %d
private_key     = %q
api_base_url    = %q

[[agents]]
id       = "web"
provider = "local"
[[agents.egress.git]]
remote     = "%s/acme/web.git"
fetch      = true
push       = ["berth/*"]
credential = "acme-bot"
`, egressBinary(t), forge.App.AppID, forge.App.InstallationID, key, forge.App.URL, forge.URL))
	env := map[string]string{"SSL_CERT_FILE": roots}
	p := New(Options{StateDir: t.TempDir(), Backends: map[string]isolation.Backend{"landlock": &recordingBackend{name: "landlock"}},
		UIDs: uidDB(t), Logger: quietLog, Getenv: func(k string) string { return env[k] }})
	prep, err := p.Prepare(t.Context(), Input{Config: cfg, Agent: "web", RunID: "r1", Attempt: 1})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	defer prep.Finish()
	e := prep.Plan.Egress
	if e == nil || e.CABundle == "" {
		t.Fatalf("egress %+v: want a proxy and a CA bundle for the git rule's host", e)
	}
	bundle, err := os.ReadFile(e.CABundle)
	if err != nil {
		t.Fatalf("the run's ca.pem was not written: %v", err)
	}
	trusted := x509.NewCertPool()
	trusted.AppendCertsFromPEM(bundle)
	token := prep.Spec(agentproto.Request{RunID: "r1"}, nil).EgressToken
	forgeHost := strings.TrimPrefix(forge.URL, "https://")

	// git's first request of a clone, inside a tunnel to the forge.
	advertise := func(repo string) int {
		t.Helper()
		conn, err := net.DialTimeout("unix", e.Socket, 10*time.Second)
		if err != nil {
			t.Fatalf("the run's proxy does not answer on its socket: %v", err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Bearer %s\r\n\r\n", forgeHost, forgeHost, token)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("CONNECT to the git rule's host: %v %v, want 200", resp, err)
		}
		host, _, _ := net.SplitHostPort(forgeHost)
		tc := tls.Client(conn, &tls.Config{RootCAs: trusted, ServerName: host})
		if err := tc.Handshake(); err != nil {
			t.Fatalf("the proxy's certificate for %s is not one the run's ca.pem signed: %v", host, err)
		}
		fmt.Fprintf(tc, "GET /%s.git/info/refs?service=git-upload-pack HTTP/1.1\r\nHost: %s\r\nGit-Protocol: version=2\r\n\r\n", repo, forgeHost)
		resp, err = http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			t.Fatalf("no answer inside the tunnel: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := advertise("acme/web"); code != http.StatusOK {
		t.Errorf("info/refs of the rule's repository: %d, want 200", code)
	}
	if code := advertise("acme/other"); code != http.StatusForbidden {
		t.Errorf("info/refs of another repository: %d, want 403", code)
	}
	tokens, asked := forge.App.Minted()
	if len(tokens) != 1 || !strings.Contains(strings.Join(asked, ""), `"web"`) {
		t.Fatalf("minted %d tokens, asked %q: want one, restricted to web", len(tokens), asked)
	}
	rec := prep.Finish()
	if forge.App.Valid(tokens[0]) {
		t.Error("the run's token is still valid after Finish: want it revoked")
	}
	if rec.Counts.Refused == 0 {
		t.Errorf("record %+v: want the other repository's refusal", rec.Counts)
	}
}
