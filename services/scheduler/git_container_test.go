package scheduler

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/gitforge"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
	"github.com/berth-dev/berth/services/images"
)

// gitContainerSession is the shell tool's script inside the container:
// each step prints how it ended. The forge is on the host's 127.0.0.1,
// which the container reaches only through the run's proxy, so NO_PROXY
// (which names loopback) is dropped.
const gitContainerSession = `export HOME="$PWD" GIT_CONFIG_NOSYSTEM=1; unset NO_PROXY no_proxy
g() { git -c user.name=agent -c user.email=agent@berth.test "$@"; }
say() { echo "$1 exit $2"; }
g clone -q FORGE/acme/web.git web >clone.log 2>&1; say clone $?; tail -3 clone.log
g clone -q FORGE/acme/other.git other >other.log 2>&1; say other $?
cd web
echo one > a.txt; g add a.txt; g commit -qm one
g push -q origin HEAD:berth/x >push.log 2>&1; say push-branch $?; tail -3 push.log
g push origin HEAD:main 2>&1 | grep 'remote rejected'
g commit -q --amend -m rewritten
g push --force origin HEAD:berth/x 2>&1 | grep 'remote rejected'
g push origin :berth/x 2>&1 | grep 'remote rejected'
g -c protocol.version=0 ls-remote -q origin >/dev/null 2>&1; say v0 $?
g -c protocol.version=2 ls-remote -q origin >/dev/null 2>&1; say v2 $?
grep -rlI -e ghs_ -e BASIC "$HOME" /proc/self/environ 2>/dev/null | sed 's/^/FOUND /'
echo done`

// gitImagePackages is what the git agent's image_config installs on the
// debootstrapped base: the default agent image has no git.
var gitImagePackages = []string{"git", "ca-certificates"}

var (
	gitImageOnce sync.Once
	gitImageErr  error
)

// ensureGitImage builds the git agent's isolation image once per test
// binary through berth-imaged's own logic. The engine keeps it by its
// content hash, so a later binary finds the container image (the slow
// part: Debian packages) and only layers the current berth-agent on it.
func ensureGitImage(t *testing.T, svc *images.Service, agent string) {
	t.Helper()
	gitImageOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		started := time.Now()
		var tag string
		tag, gitImageErr = svc.EnsureIsolationImage(ctx, agent)
		t.Logf("isolation image %s ready in %s (packages %s; %d builds started)",
			tag, time.Since(started).Round(time.Second), strings.Join(gitImagePackages, " "), svc.BuildsStarted())
	})
	if gitImageErr != nil {
		t.Fatalf("cannot build the git agent's image: %v", gitImageErr)
	}
}

// A git rule in berth.toml reaches a real container run (network none,
// an image_config image with git) through the scheduler: git inside the
// container clones the rule's repository and pushes its branch through the
// run's proxy with a token minted for the run; another repository, a push
// to main, a force-push and a deletion are refused with the reason in
// git's output, over protocol v0 and v2; the token is revoked when the run
// ends and is in no record, request, container inspect or workspace file.
func TestGitFromInsideAContainerRunClonesAndPushesOnlyWhatItsRuleAllows(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	cli := testdocker.Engine(t)
	func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := cli.ImageInspect(ctx, config.DefaultBaseImage)
		testenv.Need(t, err == nil, "%s is missing: run scripts/base-image.sh (%v)", config.DefaultBaseImage, err)
	}()
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
	quoted, _ := json.Marshal(gitImagePackages)
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
[agents.container_mode]
enabled = true
network = "none"
timeout_seconds = 300
[agents.image_config]
enabled = true
packages = %s
[[agents.egress.git]]
remote     = "%s/acme/web.git"
fetch      = true
push       = ["berth/*"]
credential = "acme-bot"
`, berthAgent(t), proxyBin, forge.App.AppID, forge.App.InstallationID, key, forge.App.URL, quoted, forge.URL)
	if err := os.WriteFile(path, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	imaged, err := images.New(cfg, t.TempDir(), images.Options{Engine: cli, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { imaged.Close() })
	ensureGitImage(t, imaged, "alpha")

	stateDir := shared
	boxes, err := container.New(container.Options{Client: cli, Instance: stateDir, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	backend := &recordingBackend{Backend: boxes}
	s, err := New(cfg, stateDir, Options{
		Backends: map[string]isolation.Backend{container.Name: backend},
		Images:   imaged,
		Getenv:   func(k string) string { return map[string]string{"SSL_CERT_FILE": roots}[k] },
		Logger:   quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	inspected := inspectRunContainer(t, cli, stateDir)
	start(t, s)

	// A token travels as itself (ghs_…) and in the Basic header the proxy
	// sends, whose base64 starts the same for every token.
	basicPrefix := base64.StdEncoding.EncodeToString([]byte("x-access-token:"))
	session := strings.NewReplacer("FORGE", forge.URL, "BASIC", basicPrefix).Replace(gitContainerSession)
	args, _ := json.Marshal(map[string]string{"command": session})
	id := submit(t, s, "m1", "alpha", "text", "/tool shell "+string(args))
	r := waitFinishedWithin(t, s, id, 5*time.Minute)
	if r.State != StateSucceeded || r.Backend != container.Name {
		t.Fatalf("run %s on %s %s (%s): reply %q, error %q, stderr %q", r.ID, r.Backend, r.State, r.Reason, r.Reply, r.Error, r.StderrTail)
	}
	for _, want := range []string{
		"clone exit 0",
		"push-branch exit 0",
		"! [remote rejected] HEAD -> main (berth: push to main is not allowed for agent alpha; allowed: berth/*)",
		"! [remote rejected] HEAD -> berth/x (berth: berth/x: a non-fast-forward update is not allowed for agent alpha (force = false)",
		"! [remote rejected] berth/x (berth: deleting berth/x is not allowed for agent alpha (delete = false))",
		"v0 exit 0", "v2 exit 0",
		"done",
	} {
		if !strings.Contains(r.Reply, want) {
			t.Errorf("the session lacks %q:\n%s", want, r.Reply)
		}
	}
	// The reply echoes the script first: a finding is a line of its own.
	if strings.Contains(r.Reply, "other exit 0") || strings.Contains(r.Reply, "\nFOUND ") {
		t.Errorf("a repository no rule names was cloned, or a token was found inside:\n%s", r.Reply)
	}
	pushed := forge.Ref("acme/web", "refs/heads/berth/x")
	if pushed == "" || forge.Ref("acme/web", "refs/heads/main") != mainBefore {
		t.Errorf("the forge has berth/x %q and main %q (was %q): want the branch pushed and main untouched",
			pushed, forge.Ref("acme/web", "refs/heads/main"), mainBefore)
	}
	var v2, v0 bool
	for _, req := range forge.Received() {
		if strings.HasSuffix(req.Path, "/git-upload-pack") || strings.HasSuffix(req.Path, "/info/refs") {
			v2 = v2 || strings.Contains(req.Protocol, "version=2")
			v0 = v0 || req.Protocol == ""
		}
	}
	if !v0 || !v2 {
		t.Errorf("the forge saw protocol v0 %v and v2 %v: want both to reach it through the proxy", v0, v2)
	}
	for _, want := range []struct{ ref, reason string }{
		{"refs/heads/main", "push to main is not allowed"},
		{"refs/heads/berth/x", "non-fast-forward"},
		{"refs/heads/berth/x", "deleting berth/x"},
	} {
		if !slices.ContainsFunc(r.Egress, func(d isolation.EgressDecision) bool {
			return !d.Allowed && d.Ref == want.ref && strings.Contains(d.Reason, want.reason)
		}) {
			t.Errorf("the record has no refusal of %s (%s): %+v", want.ref, want.reason, r.Egress)
		}
	}

	tokens, _ := forge.App.Minted()
	if len(tokens) == 0 {
		t.Fatal("the run's proxy minted no token")
	}
	inspectJSON := <-inspected
	if inspectJSON == "" {
		t.Error("could not inspect the run's container while it ran")
	}
	record, _ := json.Marshal(r)
	backend.mu.Lock()
	requests := strings.Join(backend.requests, "\n")
	backend.mu.Unlock()
	// The scheduler's state holds the run record (scheduler.db) and the
	// workspace the container had, with the clone and its .git.
	var forms []string
	for _, tok := range tokens {
		forms = append(forms, tok, base64.StdEncoding.EncodeToString([]byte("x-access-token:"+tok)))
	}
	stored, walked := filesHolding(t, stateDir, forms)
	if !slices.ContainsFunc(walked, func(p string) bool { return strings.HasSuffix(p, "/web/.git/config") }) {
		t.Errorf("the state directory has no clone to search for the token: %d files", len(walked))
	}
	for _, tok := range tokens {
		if forge.App.Valid(tok) {
			t.Error("a token of the run is still valid after it ended: want it revoked")
		}
	}
	for _, form := range forms {
		for where, text := range map[string]string{"record": string(record), "request the sandbox read": requests, "container inspect": inspectJSON, "reply": r.Reply} {
			if strings.Contains(text, form) {
				t.Errorf("the run's token is in its %s", where)
			}
		}
	}
	if len(stored) > 0 {
		t.Errorf("the run's token is in files under the state directory: %v", stored)
	}
	if !strings.Contains(inspectJSON, `"NetworkMode":"none"`) {
		t.Errorf("the run's container is not on network none: %.400s", inspectJSON)
	}
}

// inspectRunContainer inspects the first container of the instance while
// it runs (it is removed after the run); the channel gets its inspect
// JSON, or "" if none appeared within the deadline.
func inspectRunContainer(t *testing.T, cli *client.Client, instance string) <-chan string {
	t.Helper()
	inspected := make(chan string, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	go func() {
		defer cancel()
		filter := make(client.Filters).Add("label", container.LabelInstance+"="+container.InstanceLabel(instance))
		for ctx.Err() == nil {
			list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: filter})
			if err == nil && len(list.Items) > 0 {
				info, err := cli.ContainerInspect(ctx, list.Items[0].ID, client.ContainerInspectOptions{})
				if err == nil {
					inspected <- string(info.Raw)
					return
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		inspected <- ""
	}()
	return inspected
}

// filesHolding lists the files under dir that hold any of secrets, and
// every file it read.
func filesHolding(t *testing.T, dir string, secrets []string) (found, walked []string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		walked = append(walked, path)
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, s := range secrets {
			if strings.Contains(string(data), s) {
				found = append(found, path)
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("cannot read the state directory: %v", err)
	}
	return found, walked
}

// waitFinishedWithin is waitFinished with a deadline for slow runs (a
// container, git over TLS through a proxy, on a loaded machine).
func waitFinishedWithin(t *testing.T, s *Service, id string, within time.Duration) Run {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		r, err := s.GetRun(id)
		if err == nil && Finished(r.State) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is %q after %s (err %v)", id, r.State, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
