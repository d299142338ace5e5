package egress_test

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	agentegress "github.com/berth-dev/berth/agent/egress"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/testkit/gitforge"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

// gitEnv is a forge (internal/testkit/gitforge) as forge.test with its
// fake GitHub App API, one run's proxy in front of them with the git rules
// of agent web, and the relay a sandbox's git talks to.
type gitEnv struct {
	t        *testing.T
	forge    *gitforge.Forge
	proxy    proxy
	relay    *agentegress.Proxy
	ca       egress.CA
	caFile   string
	home     string
	log      *lockedBuffer
	stream   streamed
	launched *egress.Proxy // the berth-egress process, when launched
	mu       sync.Mutex
	outputs  strings.Builder // everything the sandbox's git printed
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// gitEnvOptions: launched runs berth-egress as its own process (root
// needed), its forge and API on 127.0.0.1 (the process resolves names
// with the system's resolver); firstLifetime is the first token's.
type gitEnvOptions struct {
	launched      bool
	firstLifetime time.Duration
	// configure changes the run's policy (the forge's URL is known).
	configure func(e *gitEnv, pol *egress.Policy)
}

// forgePAT is a long-lived token the forge also takes: an [[egress.secrets]]
// credential rather than an app's.
const forgePAT = "forge_pat_SECRET_0123456789"

func newGitEnv(t *testing.T, o gitEnvOptions) *gitEnv {
	t.Helper()
	e := &gitEnv{t: t, home: t.TempDir(), log: &lockedBuffer{}}
	os.WriteFile(filepath.Join(e.home, ".gitconfig"), []byte("[user]\n\tname = agent\n\temail = agent@berth.test\n[init]\n\tdefaultBranch = main\n[advice]\n\tdetachedHead = false\n"), 0o644)
	fo := gitforge.Options{ForgeName: "forge.test", APIName: "api.github.test", Token: forgePAT, FirstTokenLifetime: o.firstLifetime}
	if o.launched {
		fo.ForgeName, fo.APIName = "", ""
	}
	e.forge = gitforge.New(t, fo)
	for _, repo := range []string{"acme/web", "acme/other"} {
		e.forge.Seed(repo)
	}
	forgeURL, _ := url.Parse(e.forge.URL)
	var err error
	e.ca, err = egress.NewCA("git-run", []string{forgeURL.Hostname()}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	e.caFile = filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(e.caFile, []byte(e.ca.CertPEM), 0o644)
	pol := egress.Policy{RunID: "git-run", Agent: "web", CA: &e.ca,
		Git: []egresspolicy.GitRule{{Remote: e.forge.URL + "/acme/web.git", Fetch: true, Push: []string{"berth/*"}, Credential: "acme-bot"}},
		GitHubApps: []egress.GitHubApp{{Name: "acme-bot", AppID: e.forge.App.AppID, InstallationID: e.forge.App.InstallationID,
			APIBaseURL: e.forge.App.URL, PrivateKey: e.forge.App.PrivateKeyPEM()}}}
	if o.configure != nil {
		o.configure(e, &pol)
	}
	if o.launched {
		testenv.NeedRoot(t)
		nobody, err := isolation.LookupRunUser("nobody")
		if err != nil {
			t.Fatal(err)
		}
		root := t.TempDir()
		os.Chmod(root, 0o755)
		e.proxy.socket = filepath.Join(root, "egress", pol.RunID, isolation.EgressSocketName)
		pol.Token = token
		e.launched, err = egress.Launch(t.Context(), pol, egress.LaunchOptions{Logger: slog.New(slog.NewTextHandler(e.log, nil)),
			Binary: proxyBinary, User: nobody, Client: nobody, Socket: e.proxy.socket, RootCAsPEM: e.forge.RootsPEM()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.launched.Stop() })
	} else {
		e.proxy = startProxy(t, pol, egress.Options{Resolver: resolver{"forge.test": "127.0.0.1", "api.github.test": "127.0.0.1"},
			RootCAs: e.forge.Roots(), OnDecision: e.stream.add})
	}
	e.relay, err = agentegress.Listen(agentproto.Egress{ProxyAddr: "127.0.0.1:0", Socket: e.proxy.socket, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	go e.relay.Serve()
	t.Cleanup(func() { e.relay.Close() })
	return e
}

// sandboxEnv is a sandboxed tool's environment: the relay as its proxy
// and the run's CA, nothing else (no credential of any kind).
func (e *gitEnv) sandboxEnv() []string {
	proxy := "http://" + e.relay.Addr()
	return []string{"HOME=" + e.home, "PATH=" + os.Getenv("PATH"), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0",
		"GIT_SSL_CAINFO=" + e.caFile, "https_proxy=" + proxy, "http_proxy=" + proxy, "HTTPS_PROXY=" + proxy}
}

// git runs the sandbox's git through the proxy.
func (e *gitEnv) git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = e.sandboxEnv()
	out, err := cmd.CombinedOutput()
	e.mu.Lock()
	e.outputs.Write(out)
	e.mu.Unlock()
	return string(out), err
}

func (e *gitEnv) mustGit(dir string, args ...string) string {
	e.t.Helper()
	out, err := e.git(dir, args...)
	if err != nil {
		e.t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (e *gitEnv) clone(repo string) string {
	e.t.Helper()
	dir := filepath.Join(e.t.TempDir(), "clone")
	e.mustGit("", "clone", "-q", e.forge.URL+"/"+repo+".git", dir)
	return dir
}

func (e *gitEnv) commit(dir, file, text string) string {
	e.t.Helper()
	os.WriteFile(filepath.Join(dir, file), []byte(text), 0o644)
	e.mustGit(dir, "add", file)
	e.mustGit(dir, "commit", "-q", "-m", "change "+file)
	return strings.TrimSpace(e.mustGit(dir, "rev-parse", "HEAD"))
}

func (e *gitEnv) decisions() []egresspolicy.Decision {
	return e.stream.all()
}

func (e *gitEnv) refusedWith(reason string) bool {
	for _, d := range e.decisions() {
		if !d.Allowed && strings.Contains(d.Reason, reason) {
			return true
		}
	}
	return false
}

func TestGitFetchesTheNamedRepositoryOnlyWithProtocolV0AndV2(t *testing.T) {
	t.Parallel()
	e := newGitEnv(t, gitEnvOptions{})
	for _, version := range []string{"0", "2"} {
		t.Run("protocol_v"+version, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "web")
			e.mustGit("", "-c", "protocol.version="+version, "clone", "-q", e.forge.URL+"/acme/web.git", dir)
			if readme, err := os.ReadFile(filepath.Join(dir, "README")); err != nil || string(readme) != "the acme/web repository\n" {
				t.Fatalf("the clone holds %q, %v", readme, err)
			}
			e.mustGit(dir, "-c", "protocol.version="+version, "fetch", "-q", "origin")
			out, err := e.git("", "-c", "protocol.version="+version, "clone", "-q", e.forge.URL+"/acme/other.git", filepath.Join(t.TempDir(), "other"))
			if err == nil || !strings.Contains(out, "403") {
				t.Fatalf("a clone of another repository: %v\n%s; want it refused (403)", err, out)
			}
			out, err = e.git("", "-c", "protocol.version="+version, "ls-remote", e.forge.URL+"/acme/other")
			if err == nil {
				t.Fatalf("ls-remote of another repository worked:\n%s", out)
			}
		})
	}
	var v2, v0 bool
	for _, r := range e.forge.Received() {
		if !strings.HasPrefix(r.Path, "/acme/web.git/") {
			t.Errorf("the forge received %s: only the named repository's requests may reach it", r.Path)
		}
		if r.Authorization == "" {
			t.Errorf("%s reached the forge without the credential", r.Path)
		}
		if strings.Contains(r.Protocol, "version=2") {
			v2 = true
		} else if r.Query == "service=git-upload-pack" {
			v0 = true
		}
	}
	if !v2 || !v0 {
		t.Errorf("the forge saw protocol v2 %v, v0 %v; want both", v2, v0)
	}
	if !e.refusedWith("no [[agents.egress.git]] rule of agent web names " + e.forge.URL + "/acme/other") {
		t.Errorf("decisions %+v; want the other repository's fetch refused with its reason", e.decisions())
	}
	// The forge's host is reached for git only.
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(e.ca.CertPEM))
	relayURL, _ := url.Parse("http://" + e.relay.Addr())
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(relayURL), TLSClientConfig: &tls.Config{RootCAs: roots}}}
	code, body := do(t, c, "GET", e.forge.URL+"/acme/web.git/HEAD", "")
	if code != http.StatusForbidden || !strings.Contains(body, "only git's smart HTTP") {
		t.Errorf("a request on the forge's host that is not git's: %d %q; want 403", code, body)
	}
}

func TestGitPushesAreJudgedRefByRefBeforeAnythingIsForwarded(t *testing.T) {
	t.Parallel()
	e := newGitEnv(t, gitEnvOptions{})
	dir := e.clone("acme/web")
	first := e.forge.Ref("acme/web", "main")
	c1 := e.commit(dir, "a.txt", "one\n")

	e.mustGit(dir, "push", "-q", "origin", "HEAD:berth/x")
	if got := e.forge.Ref("acme/web", "berth/x"); got != c1 {
		t.Fatalf("berth/x on the forge is %q after the push, want %s", got, c1)
	}

	out, err := e.git(dir, "push", "origin", "HEAD:main")
	want := "! [remote rejected] HEAD -> main (berth: push to main is not allowed for agent web; allowed: berth/*)"
	if err == nil || !strings.Contains(out, want) {
		t.Fatalf("push to main: %v\n%s\nwant %q", err, out, want)
	}
	if got := e.forge.Ref("acme/web", "main"); got != first {
		t.Fatalf("main moved to %s", got)
	}

	// A fast-forward the pushed commits prove.
	c2 := e.commit(dir, "a.txt", "two\n")
	e.mustGit(dir, "push", "-q", "origin", "HEAD:berth/x")
	if got := e.forge.Ref("acme/web", "berth/x"); got != c2 {
		t.Fatalf("berth/x is %s after a fast-forward, want %s", got, c2)
	}

	// A push past git's 1 MiB post buffer goes chunked, and is kept to be
	// judged before it is sent on.
	big := make([]byte, 3<<20)
	rand.Read(big)
	c2 = e.commit(dir, "big.bin", hex.EncodeToString(big))
	if out, err := e.git(dir, "push", "-q", "origin", "HEAD:berth/x"); err != nil {
		t.Fatalf("a large push: %v\n%s\n%+v", err, out, e.decisions())
	}
	if got := e.forge.Ref("acme/web", "berth/x"); got != c2 {
		t.Fatalf("berth/x is %s after a large fast-forward, want %s", got, c2)
	}

	// A rewritten berth/x, force-pushed.
	e.mustGit(dir, "commit", "-q", "--amend", "-m", "rewritten")
	out, err = e.git(dir, "push", "--force", "origin", "HEAD:berth/x")
	if err == nil || !strings.Contains(out, "! [remote rejected] HEAD -> berth/x (berth: berth/x: a non-fast-forward update is not allowed for agent web (force = false)") {
		t.Fatalf("force-push of a rewritten berth/x: %v\n%s", err, out)
	}
	if got := e.forge.Ref("acme/web", "berth/x"); got != c2 {
		t.Fatalf("berth/x moved to %s by a force-push", got)
	}

	out, err = e.git(dir, "push", "origin", ":berth/x")
	if err == nil || !strings.Contains(out, "(berth: deleting berth/x is not allowed for agent web (delete = false))") {
		t.Fatalf("deleting berth/x: %v\n%s", err, out)
	}
	if e.forge.Ref("acme/web", "berth/x") != c2 {
		t.Fatal("berth/x was deleted")
	}

	e.mustGit(dir, "tag", "berth/v1")
	out, err = e.git(dir, "push", "origin", "refs/tags/berth/v1")
	if err == nil || !strings.Contains(out, "(berth: pushing tag berth/v1 is not allowed for agent web") || e.forge.Ref("acme/web", "refs/tags/berth/v1") != "" {
		t.Fatalf("pushing a tag: %v\n%s", err, out)
	}

	// One refused ref refuses the whole push: nothing of it is forwarded.
	c3 := e.commit(dir, "b.txt", "three\n")
	out, err = e.git(dir, "push", "origin", "HEAD:berth/y", "HEAD:main")
	if err == nil || !strings.Contains(out, "berth/y (berth: not pushed: another ref of this push was refused)") || e.forge.Ref("acme/web", "berth/y") != "" {
		t.Fatalf("a push of an allowed and a refused ref: %v\n%s", err, out)
	}

	// The forge's ancestry, where the pushed commits do not reach old:
	// main moved on (the admin), an agent branch at its old tip is moved
	// to main's new tip, which the push does not carry.
	admin := t.TempDir()
	bare := e.forge.Bare("acme/web")
	e.forge.Admin(bare, "branch", "berth/base", first)
	e.forge.Admin("", "clone", "-q", bare, admin)
	os.WriteFile(filepath.Join(admin, "c.txt"), []byte("admin\n"), 0o644)
	e.forge.Admin(admin, "add", "c.txt")
	e.forge.Admin(admin, "commit", "-q", "-m", "admin")
	e.forge.Admin(admin, "push", "-q", "origin", "main")
	mainTip := e.forge.Ref("acme/web", "main")
	e.mustGit(dir, "fetch", "-q", "origin")
	before := e.forge.App.Compares()
	e.mustGit(dir, "push", "-q", "origin", "origin/main:refs/heads/berth/base")
	if e.forge.Ref("acme/web", "berth/base") != mainTip || e.forge.App.Compares() == before {
		t.Fatalf("berth/base is %s, want %s by the forge's ancestry (compare asked %d times)", e.forge.Ref("acme/web", "berth/base"), mainTip, e.forge.App.Compares()-before)
	}
	// And back: the forge says first is behind, so it is refused.
	out, err = e.git(dir, "push", "--force", "origin", first+":refs/heads/berth/base")
	if err == nil || !strings.Contains(out, "non-fast-forward update is not allowed") || e.forge.Ref("acme/web", "berth/base") != mainTip {
		t.Fatalf("moving berth/base back: %v\n%s", err, out)
	}
	_ = c3

	// A shallow clone's push (its shallow lines come before the commands).
	shallow := filepath.Join(t.TempDir(), "shallow")
	e.mustGit("", "clone", "-q", "--depth", "1", e.forge.URL+"/acme/web.git", shallow)
	cs := e.commit(shallow, "s.txt", "shallow\n")
	e.mustGit(shallow, "push", "-q", "origin", "HEAD:berth/s")
	if e.forge.Ref("acme/web", "berth/s") != cs {
		t.Fatal("a shallow clone's push did not land")
	}

	var refs []string
	for _, d := range e.decisions() {
		if d.Ref != "" {
			refs = append(refs, fmt.Sprintf("%s %v %s", d.Ref, d.Allowed, d.Reason))
		}
	}
	joined := strings.Join(refs, "\n")
	for _, want := range []string{"refs/heads/berth/x true ", "refs/heads/main false push to main is not allowed for agent web; allowed: berth/*", "refs/heads/berth/x false deleting berth/x"} {
		if !strings.Contains(joined, want) {
			t.Errorf("the record's ref decisions:\n%s\nwant %q", joined, want)
		}
	}
}

// pktLine is one pkt-line of git's protocol.
func pktLine(s string) string { return fmt.Sprintf("%04x%s", len(s)+4, s) }

func TestGitForgedFastForwardClaimIsRefused(t *testing.T) {
	t.Parallel()
	e := newGitEnv(t, gitEnvOptions{})
	dir := e.clone("acme/web")
	first := e.forge.Ref("acme/web", "main")
	tip := e.commit(dir, "a.txt", "one\n")
	e.mustGit(dir, "push", "-q", "origin", "HEAD:berth/x")
	// A decoy that does build on berth/x, and the rewrite the command
	// names: the pack carries both, the client says old..new is all fine.
	decoy := e.commit(dir, "a.txt", "decoy\n")
	e.mustGit(dir, "reset", "-q", "--hard", first)
	rewritten := e.commit(dir, "a.txt", "rewritten\n")
	packer := exec.Command("git", "pack-objects", "--stdout", "--revs")
	packer.Dir, packer.Env = dir, e.sandboxEnv()
	packer.Stdin = strings.NewReader(rewritten + "\n" + decoy + "\n^" + first + "\n")
	pack, err := packer.Output()
	if err != nil {
		t.Fatal(err)
	}
	body := pktLine(tip+" "+rewritten+" refs/heads/berth/x\x00report-status side-band-64k object-format=sha1 agent=forger\n") + "0000" + string(pack)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(e.ca.CertPEM))
	relayURL, _ := url.Parse("http://" + e.relay.Addr())
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(relayURL), TLSClientConfig: &tls.Config{RootCAs: roots}}}
	receivePacks := func() (n int) {
		for _, r := range e.forge.Received() {
			if strings.HasSuffix(r.Path, "/git-receive-pack") {
				n++
			}
		}
		return n
	}
	before := receivePacks()
	code, answer := do(t, c, "POST", e.forge.URL+"/acme/web.git/git-receive-pack", body, "Content-Type", "application/x-git-receive-pack-request")
	if code != 200 || !strings.Contains(answer, "ng refs/heads/berth/x berth: berth/x: a non-fast-forward update is not allowed") {
		t.Fatalf("a forged fast-forward: %d %q", code, answer)
	}
	if e.forge.Ref("acme/web", "berth/x") != tip || receivePacks() != before {
		t.Fatal("the forged push reached the forge")
	}
	// The same pack naming the decoy is a fast-forward, and goes through.
	body = pktLine(tip+" "+decoy+" refs/heads/berth/x\x00report-status object-format=sha1 agent=forger\n") + "0000" + string(pack)
	code, answer = do(t, c, "POST", e.forge.URL+"/acme/web.git/git-receive-pack", body, "Content-Type", "application/x-git-receive-pack-request")
	if code != 200 || !strings.Contains(answer, "ok refs/heads/berth/x") || e.forge.Ref("acme/web", "berth/x") != decoy {
		t.Fatalf("a real fast-forward by hand: %d %q", code, answer)
	}
}

func TestGitAppTokensAreScopedRefreshedRevokedAndNeverInside(t *testing.T) {
	t.Parallel()
	// berth-egress as its own process, as the scheduler starts it; the
	// first token is inside the refresh margin: the next use mints anew.
	e := newGitEnv(t, gitEnvOptions{launched: true, firstLifetime: 5 * time.Minute})
	dir := e.clone("acme/web")
	e.mustGit(dir, "fetch", "-q", "origin")
	e.commit(dir, "a.txt", "one\n")
	e.mustGit(dir, "push", "-q", "origin", "HEAD:berth/x")
	out, err := e.git(dir, "push", "origin", "HEAD:main")
	if err == nil || !strings.Contains(out, "(berth: push to main is not allowed for agent web; allowed: berth/*)") {
		t.Fatalf("push to main through berth-egress: %v\n%s", err, out)
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", e.launched.Pid()))
	environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", e.launched.Pid()))

	minted, asked := e.forge.App.Minted()
	if len(minted) < 2 {
		t.Fatalf("%d tokens minted; want a fresh one once the first was about to expire", len(minted))
	}
	for _, a := range asked {
		if a != `{"repositories":["web"],"permissions":{"contents":"write"}}` {
			t.Errorf("token request %s; want it restricted to the rule's repository and contents write", a)
		}
	}
	record := e.launched.Stop()
	for _, tok := range minted {
		if e.forge.App.Valid(tok) {
			t.Errorf("token %s… still valid after the run", tok[:8])
		}
	}
	if !strings.Contains(string(environ), "TMPDIR=/var/tmp\x00") {
		t.Errorf("berth-egress's environment %q; want TMPDIR on disk for the pushes it keeps", environ)
	}
	if strings.Contains(string(cmdline)+string(environ), "PRIVATE KEY") {
		t.Error("the app's private key is in the proxy's argv or environment")
	}
	recorded, _ := json.Marshal(record)
	var refs []string
	for _, d := range record.Decisions {
		if d.Ref != "" {
			refs = append(refs, fmt.Sprintf("%s %v %s", d.Ref, d.Allowed, d.Reason))
		}
	}
	if joined := strings.Join(refs, "\n"); !strings.Contains(joined, "refs/heads/berth/x true") || !strings.Contains(joined, "refs/heads/main false push to main is not allowed") {
		t.Errorf("the run record's ref decisions:\n%s", joined)
	}
	if log := e.log.String(); !strings.Contains(log, "ref=refs/heads/main") || !strings.Contains(log, "push to main is not allowed") {
		t.Errorf("the journal lacks the refused ref and its reason:\n%s", log)
	}
	var inside strings.Builder
	inside.WriteString(e.outputs.String())
	inside.WriteString(strings.Join(e.sandboxEnv(), "\n"))
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			inside.Write(b)
		}
		return nil
	})
	for _, tok := range minted {
		for where, text := range map[string]string{"the sandbox": inside.String(), "the record": string(recorded), "the journal": e.log.String(),
			"the proxy's argv or environment": string(cmdline) + string(environ)} {
			if strings.Contains(text, tok) {
				t.Errorf("the token is in %s", where)
			}
		}
	}
}

func TestGitSecretCredentialGoesToTheNamedRepositoryOnly(t *testing.T) {
	t.Parallel()
	e := newGitEnv(t, gitEnvOptions{configure: func(e *gitEnv, pol *egress.Policy) {
		forge, _ := url.Parse(e.forge.URL)
		// The forge's host is also allowed for anything (a rule): requests
		// that are not git's go through, without the git rule's secret.
		rule, err := egresspolicy.ParseRule(forge.Host)
		if err != nil {
			t.Fatal(err)
		}
		pol.Allow = []egresspolicy.Rule{rule}
		pol.GitHubApps = nil
		pol.Git[0].Credential = "forge-pat"
		pol.Secrets = []egress.Secret{{Name: "forge-pat", Hosts: []string{forge.Hostname()}, Header: "Authorization", Format: "Basic {}",
			Value: base64.StdEncoding.EncodeToString([]byte("x-access-token:" + forgePAT))}}
	}})
	dir := e.clone("acme/web")
	e.commit(dir, "a.txt", "one\n")
	e.mustGit(dir, "push", "-q", "origin", "HEAD:berth/x")
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(e.ca.CertPEM))
	relayURL, _ := url.Parse("http://" + e.relay.Addr())
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(relayURL), TLSClientConfig: &tls.Config{RootCAs: roots}}}
	if code, _ := do(t, c, "GET", e.forge.URL+"/acme/other.git/HEAD", ""); code != http.StatusUnauthorized {
		t.Errorf("a request that is not git's, on an allowed host: %d; want the forge's own 401 (sent, without the secret)", code)
	}
	for _, r := range e.forge.Received() {
		named := strings.HasPrefix(r.Path, "/acme/web.git/")
		if named != (r.Authorization != "") {
			t.Errorf("%s reached the forge with Authorization %v; want it on the named repository's git requests only", r.Path, r.Authorization != "")
		}
	}
	if strings.Contains(e.outputs.String(), forgePAT) {
		t.Error("the secret reached the sandbox")
	}
}

func TestGitHubAppKeyTravelsOnlyInTheProxysStdinForm(t *testing.T) {
	t.Parallel()
	app := egress.GitHubApp{Name: "acme-bot", AppID: 1, InstallationID: 2, PrivateKey: "-----BEGIN RSA PRIVATE KEY-----\nsecret\n"}
	plain, err := json.Marshal(app)
	if err != nil || strings.Contains(string(plain), "secret") {
		t.Fatalf("an app as plans and records marshal it: %s, %v; want no key", plain, err)
	}
	wire, err := json.Marshal(egress.Policy{Agent: "web", GitHubApps: []egress.GitHubApp{app},
		Git: []egresspolicy.GitRule{{Remote: "https://forge.test/acme/web.git", Fetch: true, Credential: "acme-bot"}}})
	if err != nil {
		t.Fatal(err)
	}
	var back egress.Policy
	if err := json.Unmarshal(wire, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.GitHubApps) != 1 || back.GitHubApps[0] != app || len(back.Git) != 1 || back.Git[0].Credential != "acme-bot" {
		t.Fatalf("the proxy's stdin form read back %+v; want the app with its key and the git rule", back)
	}
}

func TestGitRulesAreCheckedWhenTheProxyIsMade(t *testing.T) {
	t.Parallel()
	for name, pol := range map[string]egress.Policy{
		"unknown credential": {Git: []egresspolicy.GitRule{{Remote: "https://forge.test/acme/web.git", Fetch: true, Credential: "nope"}}},
		"secret not for the remote's host": {Git: []egresspolicy.GitRule{{Remote: "https://forge.test/acme/web.git", Fetch: true, Credential: "pat"}},
			Secrets: []egress.Secret{{Name: "pat", Hosts: []string{"api.forge.test"}, Header: "Authorization", Format: "Bearer {}", Value: "v"}}},
		"bad app key": {Git: []egresspolicy.GitRule{{Remote: "https://forge.test/acme/web.git", Fetch: true, Credential: "app"}},
			GitHubApps: []egress.GitHubApp{{Name: "app", AppID: 1, InstallationID: 2, PrivateKey: "not a key"}}},
	} {
		pol.Token = token
		if _, err := egress.NewServer(pol, egress.Options{Logger: quiet}); err == nil || !strings.HasPrefix(err.Error(), "cannot make an egress proxy") {
			t.Errorf("%s: NewServer = %v; want a refusal", name, err)
		}
	}
}

func TestGitRulesLeaveTheModelCheckInPlace(t *testing.T) {
	t.Parallel()
	oa := fakeOpenAI(t)
	e := newGitEnv(t, gitEnvOptions{configure: func(_ *gitEnv, pol *egress.Policy) {
		pol.Providers = []egress.Provider{{Name: "openai", Kind: "openai", BaseURL: oa.URL + "/v1", Model: "m", Key: openKey}}
	}})
	e.clone("acme/web")
	if code, body := do(t, e.proxy.origin(token), "POST", "http://egress/providers/openai/chat/completions", `{"model":"m"}`); code != 200 {
		t.Errorf("the agent's own model beside its git rules: %d %q", code, body)
	}
	if code, body := do(t, e.proxy.origin(token), "POST", "http://egress/providers/openai/chat/completions", `{"model":"gpt-expensive"}`); code != http.StatusForbidden || !strings.Contains(body, `model "gpt-expensive" is not the agent's model "m"`) {
		t.Errorf("another model beside the git rules: %d %q; want 403", code, body)
	}
}
