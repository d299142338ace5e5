package egress_test

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"

	"github.com/berth-dev/berth/services/egress"
)

// Attacks of a sandbox with a shell on the git-aware egress (issue 24),
// each beside the same request made legitimate, which gets through.

// sandboxClient is an HTTP client inside the sandbox: the relay as its
// proxy, the run's CA as its roots, no credential.
func (e *gitEnv) sandboxClient() *http.Client {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(e.ca.CertPEM))
	relayURL, _ := url.Parse("http://" + e.relay.Addr())
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(relayURL), TLSClientConfig: &tls.Config{RootCAs: roots}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// packOf is a pack of the commits of revs (rev-list arguments).
func (e *gitEnv) packOf(dir string, revs ...string) string {
	e.t.Helper()
	packer := exec.Command("git", "pack-objects", "--stdout", "--revs")
	packer.Dir, packer.Env = dir, e.sandboxEnv()
	packer.Stdin = strings.NewReader(strings.Join(revs, "\n") + "\n")
	pack, err := packer.Output()
	if err != nil {
		e.t.Fatal(err)
	}
	return string(pack)
}

const zeroID = "0000000000000000000000000000000000000000"

func TestGitAttackCapabilitiesOnALaterCommandDoNotHideTheRefReceivePackUpdates(t *testing.T) {
	t.Parallel()
	// receive-pack reads every command line up to its NUL, so
	// "refs/heads/release\0-wip" updates release, which "*-wip" must not let through.
	e := newGitEnv(t, gitEnvOptions{configure: func(_ *gitEnv, pol *egress.Policy) {
		pol.Git[0].Push = []string{"berth/*", "*-wip"}
	}})
	dir := e.clone("acme/web")
	main := e.forge.Ref("acme/web", "main")
	tip := e.commit(dir, "a.txt", "one\n")
	pack := e.packOf(dir, tip, "^"+main)
	c := e.sandboxClient()
	first := pktLine(zeroID + " " + tip + " refs/heads/a-wip\x00report-status object-format=sha1 agent=attacker\n")
	smuggled := first + pktLine(zeroID+" "+tip+" refs/heads/release\x00-wip\n") + "0000" + pack
	code, answer := do(t, c, "POST", e.forge.URL+"/acme/web.git/git-receive-pack", smuggled, "Content-Type", "application/x-git-receive-pack-request")
	if got := e.forge.Ref("acme/web", "refs/heads/release"); got != "" {
		t.Fatalf("a ref hidden behind a NUL reached the forge as release (%d %q)", code, answer)
	}
	if e.forge.Ref("acme/web", "refs/heads/a-wip") != "" {
		t.Fatalf("a push with a refused command went through in part: %d %q", code, answer)
	}
	code, answer = do(t, c, "POST", e.forge.URL+"/acme/web.git/git-receive-pack", first+"0000"+pack, "Content-Type", "application/x-git-receive-pack-request")
	if code != 200 || !strings.Contains(answer, "ok refs/heads/a-wip") || e.forge.Ref("acme/web", "refs/heads/a-wip") != tip {
		t.Fatalf("the same push without the smuggled command: %d %q", code, answer)
	}
}

// commitObject writes a commit of the given content into dir's
// repository as it is (no format check) and returns its id.
func (e *gitEnv) commitObject(dir, content string) string {
	e.t.Helper()
	cmd := exec.Command("git", "hash-object", "-t", "commit", "-w", "--literally", "--stdin")
	cmd.Dir, cmd.Env, cmd.Stdin = dir, e.sandboxEnv(), strings.NewReader(content)
	out, err := cmd.Output()
	if err != nil {
		e.t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

func TestGitAttackAParentLineOutOfPlaceIsNoFastForward(t *testing.T) {
	t.Parallel()
	// Git reads a commit's parents only right after its tree: a "parent"
	// line below the author makes a root commit, a rewrite of berth/x.
	e := newGitEnv(t, gitEnvOptions{})
	dir := e.clone("acme/web")
	tip := e.commit(dir, "a.txt", "one\n")
	e.mustGit(dir, "push", "-q", "origin", "HEAD:berth/x")
	tree := strings.TrimSpace(e.mustGit(dir, "rev-parse", "HEAD^{tree}"))
	who := "agent <agent@berth.test> 1700000000 +0000"
	orphan := e.commitObject(dir, "tree "+tree+"\nauthor "+who+"\ncommitter "+who+"\nparent "+tip+"\n\nrewrite\n")
	c := e.sandboxClient()
	push := func(commit string) (int, string) {
		body := pktLine(tip+" "+commit+" refs/heads/berth/x\x00report-status object-format=sha1 agent=attacker\n") + "0000" + e.packOf(dir, commit, "^"+tip)
		return do(t, c, "POST", e.forge.URL+"/acme/web.git/git-receive-pack", body, "Content-Type", "application/x-git-receive-pack-request")
	}
	code, answer := push(orphan)
	if e.forge.Ref("acme/web", "berth/x") != tip || !strings.Contains(answer, "a non-fast-forward update is not allowed") {
		t.Fatalf("a root commit whose parent line is out of place: %d %q; berth/x is %s", code, answer, e.forge.Ref("acme/web", "berth/x"))
	}
	child := e.commitObject(dir, "tree "+tree+"\nparent "+tip+"\nauthor "+who+"\ncommitter "+who+"\n\nchild\n")
	code, answer = push(child)
	if code != 200 || !strings.Contains(answer, "ok refs/heads/berth/x") || e.forge.Ref("acme/web", "berth/x") != child {
		t.Fatalf("the same commit with its parent in place: %d %q", code, answer)
	}
}

// onePackOf is a pack of one commit object of content, made by hand: git
// itself will not pack a commit it cannot parse.
func onePackOf(content string) string {
	var pack bytes.Buffer
	pack.WriteString("PACK\x00\x00\x00\x02\x00\x00\x00\x01")
	size := len(content)
	b := byte(1<<4 | size&15)
	for size >>= 4; size > 0; size >>= 7 {
		pack.WriteByte(b | 0x80)
		b = byte(size & 0x7f)
	}
	pack.WriteByte(b)
	zw := zlib.NewWriter(&pack)
	zw.Write([]byte(content))
	zw.Close()
	sum := sha1.Sum(pack.Bytes())
	pack.Write(sum[:])
	return pack.String()
}

func TestGitAttackAParentThatIsNoObjectIDIsNeverAskedOfTheForge(t *testing.T) {
	t.Parallel()
	// A parent line is put in the compare URL asked with the run's token:
	// "main" (or a path) there would have the forge judge something else.
	e := newGitEnv(t, gitEnvOptions{})
	dir := e.clone("acme/web")
	main := e.forge.Ref("acme/web", "main")
	e.mustGit(dir, "push", "-q", "origin", "HEAD:berth/x")
	tree := strings.TrimSpace(e.mustGit(dir, "rev-parse", "HEAD^{tree}"))
	who := "agent <agent@berth.test> 1700000000 +0000"
	c := e.sandboxClient()
	push := func(commit string) (int, string) {
		id := fmt.Sprintf("%x", sha1.Sum([]byte(fmt.Sprintf("commit %d\x00%s", len(commit), commit))))
		body := pktLine(main+" "+id+" refs/heads/berth/x\x00report-status object-format=sha1 agent=attacker\n") + "0000" + onePackOf(commit)
		return do(t, c, "POST", e.forge.URL+"/acme/web.git/git-receive-pack", body, "Content-Type", "application/x-git-receive-pack-request")
	}
	before := e.forge.App.Compares()
	code, answer := push("tree " + tree + "\nparent main\nauthor " + who + "\ncommitter " + who + "\n\nnamed\n")
	if e.forge.App.Compares() != before || !strings.Contains(answer, "a non-fast-forward update is not allowed") {
		t.Fatalf("a parent named main: the forge was asked %d times; %d %q", e.forge.App.Compares()-before, code, answer)
	}
	code, answer = push("tree " + tree + "\nparent " + main + "\nauthor " + who + "\ncommitter " + who + "\n\nnamed\n")
	if code != 200 || !strings.Contains(answer, "ok refs/heads/berth/x") {
		t.Fatalf("the same commit with its parent's id: %d %q", code, answer)
	}
}

func TestGitAttackAnAdvertisementIsOfTheServiceJudged(t *testing.T) {
	t.Parallel()
	// A second "service" the proxy reads as another key must not have the
	// backend advertise receive-pack to a rule that only fetches.
	e := newGitEnv(t, gitEnvOptions{configure: func(_ *gitEnv, pol *egress.Policy) {
		pol.Git[0].Push = nil
	}})
	c := e.sandboxClient()
	advertised := func(query string) (int, string) {
		req, _ := http.NewRequest("GET", e.forge.URL+"/acme/web.git/info/refs?"+query, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Content-Type")
	}
	for _, query := range []string{
		"service=git-upload-pack&service%00=git-receive-pack",
		"service=git-receive-pack",
		"service=git-upload-pack&service=git-receive-pack",
	} {
		if code, typ := advertised(query); strings.Contains(typ, "receive-pack") || code == 200 && !strings.Contains(query, "%00") {
			t.Errorf("info/refs?%s with fetch only: %d %s", query, code, typ)
		}
	}
	if code, typ := advertised("service=git-upload-pack"); code != 200 || typ != "application/x-git-upload-pack-advertisement" {
		t.Errorf("info/refs?service=git-upload-pack: %d %s", code, typ)
	}
}

func TestGitAttackPathTricksDoNotTakeTheCredentialToAnotherRepository(t *testing.T) {
	t.Parallel()
	e := newGitEnv(t, gitEnvOptions{})
	c := e.sandboxClient()
	get := func(path, host string) (int, string) {
		req, err := http.NewRequest("GET", e.forge.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("X-Berth-Egress")
	}
	const q = "/info/refs?service=git-upload-pack"
	for _, tc := range []struct{ name, path, host string }{
		{"another_repository", "/acme/other.git" + q, ""},
		{"dot_segments", "/acme/web.git/../other.git" + q, ""},
		{"encoded_dot_segments", "/acme/web.git/%2e%2e/other.git" + q, ""},
		{"encoded_upper_case_dots", "/acme/web.git/%2E%2E/%2E%2E/acme/other.git" + q, ""},
		{"encoded_slash", "/acme%2fother.git" + q, ""},
		{"encoded_dot_git", "/acme/other%2egit" + q, ""},
		{"double_slash_before", "//acme/other.git" + q, ""},
		{"double_slash_inside", "/acme//other.git" + q, ""},
		{"dots_after_the_service_path", "/acme/web.git/info/refs/../../../other.git" + q, ""},
		{"semicolon", "/acme/other.git/info/refs;/acme/web.git" + q, ""},
		{"trailing_slash", "/acme/web.git/info/refs/?service=git-upload-pack", ""},
		{"other_case", "/acme/WEB.git" + q, ""},
		{"dumb_protocol", "/acme/web.git/HEAD", ""},
		{"host_other_than_the_tunnel", "/acme/web.git" + q, "api.github.test"},
	} {
		if code, mark := get(tc.path, tc.host); code == 200 || mark != "refused" {
			t.Errorf("%s: %s was not refused by the proxy: %d", tc.name, tc.path, code)
		}
	}
	for _, r := range e.forge.Received() {
		if r.Authorization != "" && !strings.HasPrefix(r.Path, "/acme/web.git/") {
			t.Errorf("the credential went to %s", r.Path)
		}
	}
	if code, mark := get("/acme/web.git"+q, ""); code != 200 || mark != "" {
		t.Fatalf("the rule's own repository: %d %s", code, mark)
	}
	if got := e.forge.Received(); len(got) == 0 || got[len(got)-1].Authorization == "" {
		t.Fatal("the rule's repository was reached without the credential")
	}
}

func TestGitAttackRefTricksUpdateNoRefOutsideTheGlobs(t *testing.T) {
	t.Parallel()
	e := newGitEnv(t, gitEnvOptions{})
	dir := e.clone("acme/web")
	main := e.forge.Ref("acme/web", "main")
	tip := e.commit(dir, "a.txt", "one\n")
	pack := e.packOf(dir, tip, "^"+main)
	c := e.sandboxClient()
	const caps = "\x00report-status object-format=sha1 agent=attacker\n"
	create := func(ref string) string { return pktLine(zeroID + " " + tip + " " + ref + caps) }
	push := func(body string) (int, string) {
		return do(t, c, "POST", e.forge.URL+"/acme/web.git/git-receive-pack", body, "Content-Type", "application/x-git-receive-pack-request")
	}
	for _, tc := range []struct{ name, body, ref string }{
		{"dot_dot_in_the_branch", create("refs/heads/berth/../main") + "0000" + pack, "refs/heads/main"},
		{"an_allowed_and_a_refused_ref", create("refs/heads/berth/ok") + pktLine(main+" "+tip+" refs/heads/main\n") + "0000" + pack, "refs/heads/berth/ok"},
		{"other_case", create("refs/heads/Berth/x") + "0000" + pack, "refs/heads/Berth/x"},
		{"gerrit_review", create("refs/for/main") + "0000" + pack, "refs/for/main"},
		{"head", create("HEAD") + "0000" + pack, "HEAD"},
		{"notes", create("refs/notes/berth/x") + "0000" + pack, "refs/notes/berth/x"},
		{"pull", create("refs/pull/1/head") + "0000" + pack, "refs/pull/1/head"},
		{"a_tag", create("refs/tags/berth/v1") + "0000" + pack, "refs/tags/berth/v1"},
		{"a_branch_under_the_glob", create("refs/heads/berth/x/y") + "0000" + pack, "refs/heads/berth/x/y"},
		{"heads_without_refs", create("heads/berth/x") + "0000" + pack, "heads/berth/x"},
		{"a_very_long_ref", create("refs/heads/main/"+strings.Repeat("x", 60000)) + "0000" + pack, "refs/heads/main"},
		{"commands_after_the_flush", create("refs/heads/berth/flush") + "0000" + pktLine(main+" "+tip+" refs/heads/main\n") + "0000" + pack, "refs/heads/main"},
		{"a_command_in_the_capabilities", pktLine(zeroID+" "+tip+" refs/heads/berth/caps\x00report-status\n"+main+" "+tip+" refs/heads/main\n") + "0000" + pack, "refs/heads/main"},
		{"a_command_as_a_push_option", pktLine(zeroID+" "+tip+" refs/heads/berth/opts\x00report-status push-options\n") + "0000" + pktLine(main+" "+tip+" refs/heads/main\n") + "0000" + pack, "refs/heads/main"},
		{"a_pkt_line_over_git_s_largest", "ffff" + strings.Repeat("x", 65531) + "0000" + pack, "refs/heads/main"},
	} {
		before := e.forge.Ref("acme/web", tc.ref)
		code, answer := push(tc.body)
		if got := e.forge.Ref("acme/web", tc.ref); got != before {
			t.Errorf("%s: %s is %s on the forge (%d %q)", tc.name, tc.ref, got, code, answer)
		}
		if e.forge.Ref("acme/web", "refs/heads/main") != main {
			t.Fatalf("%s: main moved (%d %q)", tc.name, code, answer)
		}
	}
	code, answer := push(create("refs/heads/berth/x") + "0000" + pack)
	if code != 200 || !strings.Contains(answer, "ok refs/heads/berth/x") || e.forge.Ref("acme/web", "refs/heads/berth/x") != tip {
		t.Fatalf("the same push of berth/x: %d %q", code, answer)
	}
}

func TestGitAttackAPushThatSaysItIsCompressedIsRefusedWhateverHeaderComesFirst(t *testing.T) {
	t.Parallel()
	// The proxy reads the commands as sent; a forge that inflates the body
	// would read others. Every Content-Encoding the request has counts.
	e := newGitEnv(t, gitEnvOptions{})
	dir := e.clone("acme/web")
	main := e.forge.Ref("acme/web", "main")
	tip := e.commit(dir, "a.txt", "one\n")
	body := pktLine(zeroID+" "+tip+" refs/heads/berth/x\x00report-status object-format=sha1 agent=attacker\n") + "0000" + e.packOf(dir, tip, "^"+main)
	c := e.sandboxClient()
	push := func(encodings ...string) (int, string) {
		req, _ := http.NewRequest("POST", e.forge.URL+"/acme/web.git/git-receive-pack", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/x-git-receive-pack-request")
		req.Header["Content-Encoding"] = encodings
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		answer, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(answer)
	}
	for _, encodings := range [][]string{{"identity", "gzip"}, {"identity, gzip"}, {"gzip"}, {"deflate"}, {"br"}} {
		code, answer := push(encodings...)
		if code != http.StatusUnsupportedMediaType || e.forge.Ref("acme/web", "berth/x") != "" {
			t.Errorf("a push with Content-Encoding %q: %d %q; berth/x is %q", encodings, code, answer, e.forge.Ref("acme/web", "berth/x"))
		}
	}
	if code, answer := push("identity"); code != 200 || e.forge.Ref("acme/web", "berth/x") != tip {
		t.Fatalf("the same push as identity: %d %q", code, answer)
	}
}

func TestGitAttackARefIsJudgedAsReceivePackSplitsItsCommand(t *testing.T) {
	t.Parallel()
	// receive-pack takes the ref as the rest of the line after one space;
	// a no-break space after it is part of the ref git updates.
	e := newGitEnv(t, gitEnvOptions{configure: func(_ *gitEnv, pol *egress.Policy) {
		pol.Git[0].Push = []string{"*-wip"}
	}})
	dir := e.clone("acme/web")
	main := e.forge.Ref("acme/web", "main")
	tip := e.commit(dir, "a.txt", "one\n")
	pack := e.packOf(dir, tip, "^"+main)
	c := e.sandboxClient()
	push := func(ref string) (int, string) {
		body := pktLine(zeroID+" "+tip+" "+ref+"\x00report-status object-format=sha1 agent=attacker\n") + "0000" + pack
		return do(t, c, "POST", e.forge.URL+"/acme/web.git/git-receive-pack", body, "Content-Type", "application/x-git-receive-pack-request")
	}
	for _, ref := range []string{"refs/heads/a-wip\u00a0", "refs/heads/a-wip\u2003x", "refs/heads/b-wip\u0085"} {
		code, answer := push(ref)
		if got := e.forge.Ref("acme/web", ref); got != "" {
			t.Errorf("%q, which no glob names, is %s on the forge (%d %q)", ref, got, code, answer)
		}
	}
	if code, answer := push("refs/heads/a-wip"); code != 200 || e.forge.Ref("acme/web", "refs/heads/a-wip") != tip {
		t.Fatalf("the same push of a-wip: %d %q", code, answer)
	}
}

func TestGitAttackAChunkedPushIsJudgedOnItsWholeCommandList(t *testing.T) {
	t.Parallel()
	e := newGitEnv(t, gitEnvOptions{})
	dir := e.clone("acme/web")
	main := e.forge.Ref("acme/web", "main")
	tip := e.commit(dir, "a.txt", "one\n")
	pack := e.packOf(dir, tip, "^"+main)
	c := e.sandboxClient()
	// Each piece is a chunk of its own; the first ends inside a pkt-line.
	push := func(pieces ...string) (int, string) {
		r, w := io.Pipe()
		go func() {
			for _, p := range pieces {
				if _, err := w.Write([]byte(p)); err != nil {
					return
				}
			}
			w.Close()
		}()
		req, _ := http.NewRequest("POST", e.forge.URL+"/acme/web.git/git-receive-pack", r)
		req.Header.Set("Content-Type", "application/x-git-receive-pack-request")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		answer, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(answer)
	}
	first := pktLine(zeroID + " " + tip + " refs/heads/berth/x\x00report-status object-format=sha1 agent=attacker\n")
	second := pktLine(main + " " + tip + " refs/heads/main\n")
	code, answer := push(first, second[:7], second[7:]+"0000", pack)
	if e.forge.Ref("acme/web", "main") != main || e.forge.Ref("acme/web", "berth/x") != "" || !strings.Contains(answer, "ng refs/heads/main berth: push to main is not allowed") {
		t.Fatalf("a chunked push naming main: %d %q", code, answer)
	}
	code, answer = push(first[:9], first[9:]+"0000", pack[:20], pack[20:])
	if code != 200 || !strings.Contains(answer, "ok refs/heads/berth/x") || e.forge.Ref("acme/web", "berth/x") != tip {
		t.Fatalf("the same chunked push without main: %d %q", code, answer)
	}
}
