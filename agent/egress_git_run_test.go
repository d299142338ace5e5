package agent_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/testkit/gitforge"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

// gitResolver resolves the forge's and its API's names for the proxy.
type gitResolver struct{}

func (gitResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if host == "forge.test" || host == "api.github.test" {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// A shell tool, inside a confined host run with no network but the egress
// proxy, works on the one repository its git rule names. Each line it
// prints says how a step ended.
const gitSession = `export HOME="$PWD" GIT_CONFIG_NOSYSTEM=1
g() { git -c user.name=agent -c user.email=agent@berth.test "$@"; }
say() { echo "$1 exit $2"; }
g clone -q https://forge.test:PORT/acme/web.git web >clone.log 2>&1; say clone $?; tail -3 clone.log
g clone -q https://forge.test:PORT/acme/other.git other >other.log 2>&1; say other $?
cd web
echo one > a.txt; g add a.txt; g commit -qm one
g push -q origin HEAD:berth/x >push.log 2>&1; say push-branch $?
g push origin HEAD:main 2>&1 | grep 'remote rejected'
g commit -q --amend -m rewritten
g push --force origin HEAD:berth/x 2>&1 | grep 'remote rejected'
g push origin :berth/x 2>&1 | grep 'remote rejected'
g -c protocol.version=0 ls-remote -q origin >/dev/null 2>&1; say v0 $?
g -c protocol.version=2 ls-remote -q origin >/dev/null 2>&1; say v2 $?
grep -rlI ghs_ "$HOME" /proc/self/environ 2>/dev/null | sed 's/^/FOUND /'
echo done`

func TestGitFromInsideAHostRunClonesAndPushesOnlyWhatItsRulesAllow(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	testenv.NeedRoot(t)
	forge := gitforge.New(t, gitforge.Options{ForgeName: "forge.test", APIName: "api.github.test"})
	forge.Seed("acme/web")
	forge.Seed("acme/other")
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(forge.URL, "https://"))
	model := newFakeOpenAI(t, shellModel)
	root := users(t)[1]
	f := openFixture(t, root)

	ca, err := egress.NewCA("run-1", []string{"forge.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(f.root, isolation.EgressCABundleName)
	if err := os.WriteFile(bundle, ca.Bundle(), 0o644); err != nil {
		t.Fatal(err)
	}
	decisions := &streamedDecisions{}
	srv, err := egress.NewServer(egress.Policy{RunID: "run-1", Agent: "web", Token: egressToken, CA: &ca,
		Providers: []egress.Provider{{Name: "fake", Kind: "openai", BaseURL: model.srv.URL + "/v1", Model: "gpt-test", Key: providerKey}},
		Git:       []egresspolicy.GitRule{{Remote: forge.URL + "/acme/web.git", Fetch: true, Push: []string{"berth/*"}, Credential: "acme-bot"}},
		GitHubApps: []egress.GitHubApp{{Name: "acme-bot", AppID: forge.App.AppID, InstallationID: forge.App.InstallationID,
			APIBaseURL: forge.App.URL, PrivateKey: forge.App.PrivateKeyPEM()}}},
		egress.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), OnDecision: decisions.add,
			Resolver: gitResolver{}, RootCAs: forge.Roots()})
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(f.root, "egress.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	req := egressRun{socket: socket}.request(f, strings.ReplaceAll(gitSession, "PORT", port))
	// What a host run's plan grants (isolation's system sets), and the bundle.
	// What a host run's plan grants (isolation's system sets, as far as
	// this host has them), and the bundle.
	existing := func(paths []string) (out []string) {
		for _, p := range paths {
			if _, err := os.Stat(p); err == nil && !slices.Contains(req.Policy.AllowRead, p) && !slices.Contains(req.Policy.AllowReadWrite, p) {
				out = append(out, p)
			}
		}
		return out
	}
	req.Policy.AllowRead = append(append(req.Policy.AllowRead, existing(isolation.SystemReadOnly)...), bundle)
	req.Policy.AllowReadWrite = append(req.Policy.AllowReadWrite, existing(isolation.SystemReadWrite)...)
	req.Egress.CABundle = bundle
	res := runInNamespace(t, req, root, &syscall.SysProcAttr{})
	res.expect(t, agentproto.ExitOK, "done")
	var tool struct {
		Stdout string `json:"stdout"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(res.resp.Reply, "the tool said: ")), &tool); err != nil {
		t.Fatalf("the reply is not the tool's output: %v\n%s", err, res.resp.Reply)
	}
	out := tool.Stdout
	for _, want := range []string{
		"clone exit 0",
		"push-branch exit 0",
		"! [remote rejected] HEAD -> main (berth: push to main is not allowed for agent web; allowed: berth/*)",
		"! [remote rejected] HEAD -> berth/x (berth: berth/x: a non-fast-forward update is not allowed for agent web (force = false)",
		"! [remote rejected] berth/x (berth: deleting berth/x is not allowed for agent web (delete = false))",
		"v0 exit 0", "v2 exit 0",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the session lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "other exit 0") || strings.Contains(out, "FOUND") {
		t.Errorf("another repository was cloned, or a token was found inside:\n%s", out)
	}
	if forge.Ref("acme/web", "main") == forge.Ref("acme/web", "berth/x") || forge.Ref("acme/web", "berth/x") == "" {
		t.Errorf("the forge's berth/x is %q, main %q; want berth/x pushed and main untouched", forge.Ref("acme/web", "berth/x"), forge.Ref("acme/web", "main"))
	}
	srv.Close()
	minted, _ := forge.App.Minted()
	if len(minted) == 0 {
		t.Fatal("no installation token was minted")
	}
	for _, tok := range minted {
		if forge.App.Valid(tok) {
			t.Error("a token of the run is still valid after it")
		}
		if strings.Contains(res.stdout+res.stderr, tok) {
			t.Error("a token reached the sandbox's output")
		}
	}
	var refusedMain bool
	for _, d := range decisions.all() {
		refusedMain = refusedMain || d.Ref == "refs/heads/main" && !d.Allowed
	}
	if !refusedMain {
		t.Errorf("the record lacks the refused push to main: %+v", decisions.all())
	}
}
