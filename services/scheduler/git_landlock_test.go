package scheduler

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/gitforge"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

// gitRunSession is the shell tool's script: each step prints how it ended.
// The forge is on the host's 127.0.0.1, which NO_PROXY names for the
// sandbox's own loopback: git must ask the proxy for it anyway.
const gitRunSession = `export HOME="$PWD" GIT_CONFIG_NOSYSTEM=1; unset NO_PROXY no_proxy
g() { git -c user.name=agent -c user.email=agent@berth.test "$@"; }
g clone -q FORGE/acme/web.git web >clone.log 2>&1; echo "clone exit $?"; tail -3 clone.log
g clone -q FORGE/acme/other.git other >other.log 2>&1; echo "other exit $?"
cd web
echo one > a.txt; g add a.txt; g commit -qm one
g push -q origin HEAD:berth/x >push.log 2>&1; echo "push-branch exit $?"; tail -3 push.log
g push origin HEAD:main 2>&1 | grep 'remote rejected'
echo done`

// A git rule in berth.toml reaches a real landlock run through the
// scheduler: its shell tool clones the rule's repository and pushes its
// branch with a token the run's proxy minted, another repository and a
// push to main are refused with the reason in git's output, the record
// has each decision with its ref, and the token is revoked when the run
// ends and appears nowhere the sandbox or the record could show it.
func TestGitARunFromBerthTomlClonesAndPushesOnlyWhatItsRuleAllows(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	_, proxyBin := egressBinaries(t)
	forge := gitforge.New(t, gitforge.Options{})
	forge.Seed("acme/web")
	forge.Seed("acme/other")
	mainBefore := forge.Ref("acme/web", "refs/heads/main")
	shared := sharedStateDir(t)
	roots := filepath.Join(shared, "forge-roots.pem")
	key := filepath.Join(shared, "acme-bot.pem")
	if err := os.WriteFile(roots, forge.RootsPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, []byte(forge.App.PrivateKeyPEM()), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "berth.toml")
	toml := fmt.Sprintf(`
[scheduler]
agent_binary = %q
egress_binary = %q
egress_user = "daemon"
run_as = "nobody"

[[egress.github_apps]]
name            = "acme-bot"
app_id          = %d
installation_id = %d
private_key     = %q
api_base_url    = %q

[[agents]]
id = "alpha"
provider = "local"
workspace_quota = "0"
[[agents.egress.git]]
remote     = "%s/acme/web.git"
fetch      = true
push       = ["berth/*"]
credential = "acme-bot"
`, berthAgent(t), proxyBin, forge.App.AppID, forge.App.InstallationID, key, forge.App.URL, forge.URL)
	if err := os.WriteFile(path, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	backend := &recordingBackend{Backend: landlock.New()}
	s, err := New(cfg, sharedStateDir(t), Options{
		Backends: map[string]isolation.Backend{landlock.Name: backend},
		Getenv:   func(k string) string { return map[string]string{"SSL_CERT_FILE": roots}[k] },
		Logger:   quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	start(t, s)

	args, _ := json.Marshal(map[string]string{"command": strings.ReplaceAll(gitRunSession, "FORGE", forge.URL)})
	id := submit(t, s, "m1", "alpha", "text", "/tool shell "+string(args))
	r := waitFinished(t, s, id)
	if r.State != StateSucceeded {
		t.Fatalf("run %s %s (%s): reply %q, error %q, stderr %q", r.ID, r.State, r.Reason, r.Reply, r.Error, r.StderrTail)
	}
	for _, want := range []string{
		"clone exit 0",
		"push-branch exit 0",
		"! [remote rejected] HEAD -> main (berth: push to main is not allowed for agent alpha; allowed: berth/*)",
		"done",
	} {
		if !strings.Contains(r.Reply, want) {
			t.Errorf("the session lacks %q:\n%s", want, r.Reply)
		}
	}
	if strings.Contains(r.Reply, "other exit 0") {
		t.Errorf("a repository no rule names was cloned:\n%s", r.Reply)
	}
	if forge.Ref("acme/web", "refs/heads/berth/x") == "" || forge.Ref("acme/web", "refs/heads/main") != mainBefore {
		t.Errorf("the forge has berth/x %q and main %q (was %q): want the branch pushed and main untouched",
			forge.Ref("acme/web", "refs/heads/berth/x"), forge.Ref("acme/web", "refs/heads/main"), mainBefore)
	}
	if !slices.ContainsFunc(r.Egress, func(d isolation.EgressDecision) bool {
		return !d.Allowed && d.Ref == "refs/heads/main" && strings.Contains(d.Reason, "push to main is not allowed")
	}) {
		t.Errorf("the record has no refusal of the push to main with its ref: %+v", r.Egress)
	}
	tokens, _ := forge.App.Minted()
	if len(tokens) == 0 {
		t.Fatal("the run's proxy minted no token")
	}
	record, _ := json.Marshal(r)
	backend.mu.Lock()
	requests := strings.Join(backend.requests, "\n")
	backend.mu.Unlock()
	for _, tok := range tokens {
		if forge.App.Valid(tok) {
			t.Error("a token of the run is still valid after it ended: want it revoked")
		}
		if strings.Contains(string(record), tok) || strings.Contains(requests, tok) {
			t.Error("the run's token is in its record or the request the sandbox read")
		}
	}
}
