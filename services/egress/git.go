package egress

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// gitState is what a run's proxy needs for its [[agents.egress.git]]
// rules: the app tokens and secrets those rules name, and the client that
// asks the forge's API (the admin's endpoint, like a provider's).
type gitState struct {
	apps    map[string]*appTokens
	secrets map[string]*Secret
	api     *http.Client
	timeout time.Duration
}

// maxSpooledPush bounds a push the proxy keeps to judge its ancestry
// before forwarding it (GitHub's own limit on a push).
const maxSpooledPush = 2 << 30

// maxForgeQuestions bounds the compare calls one ref update may cost.
const maxForgeQuestions = 16

// maxCommandBytes bounds a push's command list, read before anything else.
const maxCommandBytes = 1 << 20

func newGitState(pol Policy, api *http.Client, timeout time.Duration) (*gitState, error) {
	var names []string
	g := &gitState{apps: map[string]*appTokens{}, secrets: map[string]*Secret{}, api: api, timeout: timeout}
	for i := range pol.Secrets {
		names = append(names, pol.Secrets[i].Name)
		g.secrets[pol.Secrets[i].Name] = &pol.Secrets[i]
	}
	for _, app := range pol.GitHubApps {
		names = append(names, app.Name)
		t, err := newAppTokens(app, pol.Git, api, timeout)
		if err != nil {
			return nil, fmt.Errorf("cannot make an egress proxy: %w", err)
		}
		g.apps[app.Name] = t
	}
	if err := egresspolicy.CheckGitRules(pol.Git, names); err != nil {
		return nil, fmt.Errorf("cannot make an egress proxy: %w", err)
	}
	// A secret goes only to a host it names, whichever rule names it.
	for _, r := range pol.Git {
		rem, _ := egresspolicy.ParseGitRemote(r.Remote)
		if sec, ok := g.secrets[r.Credential]; ok && !sec.For(rem.Host, rem.Port) {
			return nil, fmt.Errorf("cannot make an egress proxy: git rule %s: secret %s is not for %s:%d (its hosts: %s)", r.Remote, sec.Name, rem.Host, rem.Port, strings.Join(sec.Hosts, ", "))
		}
	}
	return g, nil
}

// close revokes the run's app tokens.
func (g *gitState) close(log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*g.timeout)
	defer cancel()
	for _, t := range g.apps {
		if err := t.close(ctx); err != nil {
			log.Warn("cannot revoke the run's GitHub app tokens", "err", err)
		}
	}
}

// gitCredential is what one rule's requests get: the header added on the
// way out, and how the forge's API is asked about ancestry (api is empty
// when there is none to ask).
type gitCredential struct {
	header, value string
	api, apiAuth  string
}

func (g *gitState) credential(ctx context.Context, rule egresspolicy.GitRule) (gitCredential, error) {
	var c gitCredential
	if rem, _ := egresspolicy.ParseGitRemote(rule.Remote); rem.Host == "github.com" && rem.Port == 443 {
		c.api = egresspolicy.GitHubAPI
	}
	if rule.Credential == "" {
		return c, nil
	}
	if t, ok := g.apps[rule.Credential]; ok {
		ctx, cancel := context.WithTimeout(ctx, 2*g.timeout)
		defer cancel()
		tok, err := t.get(ctx)
		if err != nil {
			return c, err
		}
		c.header = "Authorization"
		c.value = "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+tok))
		c.api, c.apiAuth = t.app.API(), "Bearer "+tok
		return c, nil
	}
	sec, ok := g.secrets[rule.Credential]
	if !ok {
		return c, fmt.Errorf("credential %q is not in the run's policy", rule.Credential)
	}
	c.header, c.value = sec.Header, strings.ReplaceAll(sec.Format, "{}", sec.Value)
	// The API is another host: a secret goes there only if it names it
	// (else the API is asked without one, which a public repository answers).
	if api, err := url.Parse(c.api); err == nil && c.api != "" && sec.For(api.Hostname(), 443) && strings.EqualFold(sec.Header, "Authorization") {
		c.apiAuth = c.value
	}
	return c, nil
}

// gitOne serves one git smart-HTTP request of an intercepted tunnel (req
// already addressed to the judged destination): judged by the agent's git
// rules, the rule's credential added, a push's commands judged before
// anything of it is forwarded. It says whether the tunnel may carry another.
func (s *Server) gitOne(conn net.Conn, transport *http.Transport, req *http.Request, ctx context.Context, rd egresspolicy.Decision, g egresspolicy.GitRequest, parseErr error) bool {
	rd.Rule = "git"
	if parseErr != nil {
		return s.refuseIntercepted(conn, req, rd, http.StatusForbidden, parseErr.Error())
	}
	rule, ref := s.judge.GitAccess(rd.Host, rd.Port, g)
	if ref != nil {
		return s.refuseIntercepted(conn, req, rd, ref.Code, ref.Reason)
	}
	rd.Rule = "git " + rule.Remote
	cred, err := s.git.credential(ctx, rule)
	if err != nil {
		return s.refuseIntercepted(conn, req, rd, http.StatusBadGateway, "git: "+err.Error())
	}
	// Whatever the sandbox sent as a credential is dropped: only the rule's
	// goes out, and only on the rule's repository.
	req.Header.Del("Authorization")
	req.Header.Del("Cookie")
	if cred.header != "" {
		req.Header.Set(cred.header, cred.value)
	}
	if g.Service == egresspolicy.GitReceivePack && !g.Advertise {
		return s.gitPush(conn, transport, req, ctx, rd, rule, g, cred)
	}
	return s.sendIntercepted(conn, transport, req, ctx, rd)
}

// gitPush judges a receive-pack call by its command list and forwards it
// only when every update is allowed; otherwise it answers as receive-pack
// would, refusing each update with its reason, so `git push` prints them.
func (s *Server) gitPush(conn net.Conn, transport *http.Transport, req *http.Request, ctx context.Context, rd egresspolicy.Decision, rule egresspolicy.GitRule, g egresspolicy.GitRequest, cred gitCredential) bool {
	if compressed(req.Header) {
		return s.refuseIntercepted(conn, req, rd, http.StatusUnsupportedMediaType, "git: berth reads a push's commands, which must not be compressed (git never compresses a push)")
	}
	if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
		io.WriteString(conn, "HTTP/1.1 100 Continue\r\n\r\n")
		req.Header.Del("Expect")
	}
	var head bytes.Buffer
	cmds, err := readPushCommands(io.TeeReader(io.LimitReader(req.Body, maxCommandBytes), &head))
	if err != nil {
		return s.refuseIntercepted(conn, req, rd, http.StatusBadRequest, "git: cannot read the push's commands: "+err.Error())
	}
	reasons := make([]string, len(cmds.updates))
	refused := false
	var mustFastForward []int
	for i, u := range cmds.updates {
		ff, r := s.judge.GitPush(rule, u)
		switch {
		case r != nil:
			reasons[i], refused = r.Reason, true
		case ff:
			mustFastForward = append(mustFastForward, i)
		}
	}
	var body io.Reader = io.MultiReader(&head, req.Body)
	if !refused && len(mustFastForward) > 0 {
		spool, err := spoolPush(req.Body)
		if err != nil {
			return s.refuseIntercepted(conn, req, rd, http.StatusBadRequest, "git: "+err.Error())
		}
		defer spool.Close()
		commits, err := spooledCommits(spool, cmds.objectFormat())
		if err != nil {
			return s.refuseIntercepted(conn, req, rd, http.StatusBadRequest, "git: "+err.Error())
		}
		for _, i := range mustFastForward {
			if why := s.notFastForward(ctx, commits, cmds.updates[i], g, cred); why != "" {
				reasons[i], refused = s.judge.NotFastForward(cmds.updates[i], why).Reason, true
			}
		}
		if _, err := spool.Seek(0, io.SeekStart); err != nil {
			return s.refuseIntercepted(conn, req, rd, http.StatusInternalServerError, "git: cannot read the kept push again")
		}
		body = io.MultiReader(&head, spool)
	}
	if refused {
		for i := range reasons {
			if reasons[i] == "" {
				reasons[i] = "not pushed: another ref of this push was refused"
			}
			reasons[i] = "berth: " + reasons[i]
		}
	}
	for i, u := range cmds.updates {
		d := rd
		d.Time, d.Ref, d.Allowed, d.Reason = time.Now(), u.Ref, !refused, strings.TrimPrefix(reasons[i], "berth: ")
		s.record(d)
	}
	if !refused {
		req.Body = io.NopCloser(body)
		return s.sendIntercepted(conn, transport, req, ctx, rd)
	}
	// What the client still sends is read, within a bound, so it reads
	// the refusal rather than a broken pipe.
	n, _ := io.Copy(io.Discard, io.LimitReader(req.Body, 64<<20))
	drained := n < 64<<20
	if !cmds.has("report-status") && !cmds.has("report-status-v2") {
		writeRefusal(conn, http.StatusForbidden, strings.Join(reasons, "; "), drained)
		return drained
	}
	report := reportStatus(cmds, reasons)
	closing := ""
	if !drained {
		closing = "Connection: close\r\n"
	}
	fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/x-git-receive-pack-result\r\nCache-Control: no-cache\r\nX-Berth-Egress: refused\r\n%sContent-Length: %d\r\n\r\n", closing, len(report))
	conn.Write(report)
	return drained
}

// compressed says whether any Content-Encoding of h is not identity: a
// forge that inflated the body would read other commands than berth did.
func compressed(h http.Header) bool {
	for _, v := range h.Values("Content-Encoding") {
		for enc := range strings.SplitSeq(v, ",") {
			if enc = strings.TrimSpace(enc); enc != "" && !strings.EqualFold(enc, "identity") {
				return true
			}
		}
	}
	return false
}

// spoolPush keeps the rest of a push (its pack) in an unlinked file, so it
// is judged before a byte of it goes out and then sent as it came.
func spoolPush(body io.Reader) (*os.File, error) {
	f, err := os.CreateTemp("", "berth-git-push-")
	if err != nil {
		return nil, fmt.Errorf("cannot keep the push to judge it: %w", err)
	}
	os.Remove(f.Name())
	n, err := io.Copy(f, io.LimitReader(body, maxSpooledPush+1))
	if err == nil && n > maxSpooledPush {
		err = fmt.Errorf("the push is over the %d bytes berth judges", int64(maxSpooledPush))
	}
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("cannot keep the push to judge it: %w", err)
	}
	return f, nil
}

// notFastForward says why update i of cmds is not a fast-forward, or ""
// when it is: the pushed commits are read for a path from new to old, and
// where such paths leave the pack, the forge is asked whether old is an
// ancestor of the commit there. Nothing the client says is taken for it.
func (s *Server) notFastForward(ctx context.Context, commits packCommits, u egresspolicy.RefUpdate, g egresspolicy.GitRequest, cred gitCredential) string {
	found, boundary := commits.ancestry(u.Old, u.New)
	if found {
		return ""
	}
	if len(boundary) == 0 {
		return fmt.Sprintf("%s is not an ancestor of %s", short(u.Old), short(u.New))
	}
	if cred.api == "" {
		return fmt.Sprintf("the pushed commits do not lead to %s, and no forge API can say whether it is an ancestor of the rest", short(u.Old))
	}
	if len(boundary) > maxForgeQuestions {
		return fmt.Sprintf("the pushed commits leave the pack at %d commits; berth asks the forge about %d at most", len(boundary), maxForgeQuestions)
	}
	repo := strings.TrimPrefix(g.Repo, "/")
	for _, b := range boundary {
		ok, err := forgeAncestry(ctx, s.git.api, s.git.timeout, cred.api, repo, cred.apiAuth, u.Old, b)
		if err != nil {
			return "cannot tell whether it is one: " + err.Error()
		}
		if ok {
			return ""
		}
	}
	return fmt.Sprintf("%s is not an ancestor of %s", short(u.Old), short(u.New))
}

// spooledCommits are the commits of the kept push's pack (none when the
// push sent no pack: only deletions, or objects the remote has).
func spooledCommits(spool *os.File, objectFormat string) (packCommits, error) {
	info, err := spool.Stat()
	if err != nil || info.Size() == 0 {
		return packCommits{}, err
	}
	return readPackCommits(spool, objectFormat)
}

func short(id string) string { return id[:min(len(id), 12)] }

// sendIntercepted sends one judged request of an intercepted tunnel and
// writes the answer back; it says whether the tunnel may carry another.
func (s *Server) sendIntercepted(conn net.Conn, transport *http.Transport, req *http.Request, ctx context.Context, rd egresspolicy.Decision) bool {
	var up countingReader
	if req.Body != nil && req.Body != http.NoBody {
		up.r = req.Body
		req.Body = io.NopCloser(&up)
	}
	resp, err := transport.RoundTrip(req.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		rd.BytesUp = up.n
		return s.refuseIntercepted(conn, req, rd, http.StatusBadGateway, "cannot reach the destination: "+err.Error())
	}
	stripHopHeaders(resp.Header)
	var down countingReader
	down.r = resp.Body
	resp.Body = io.NopCloser(&down)
	err = resp.Write(conn)
	resp.Body.Close()
	rd.Allowed, rd.BytesUp, rd.BytesDown = true, up.n, down.n
	s.record(rd)
	return err == nil && !req.Close && !resp.Close
}

// refuseIntercepted records rd refused and answers the request inside the
// tunnel; the tunnel carries another only if the request had no body left.
func (s *Server) refuseIntercepted(conn net.Conn, req *http.Request, rd egresspolicy.Decision, code int, reason string) bool {
	rd.Allowed, rd.Reason = false, reason
	s.record(rd)
	keep := req.Body == nil || req.Body == http.NoBody
	writeRefusal(conn, code, "berth egress refused "+req.Method+" "+rd.Host+": "+reason, keep)
	return keep
}
