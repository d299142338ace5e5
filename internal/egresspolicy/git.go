package egresspolicy

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
)

// GitRule is one [[agents.egress.git]] entry: what an agent may do with
// the repositories at Remote over git's smart HTTP. Remote is an https URL
// whose path may be a glob ("https://github.com/acme/*": a "*" stays
// within one path segment); the host is exact. Push holds branch globs
// ("berth/*"); a tag is never pushed. Credential names an [[egress.secrets]]
// or [[egress.github_apps]] entry the proxy adds to this rule's requests
// only (docs/adr/0019-git-aware-egress.md).
type GitRule struct {
	Remote     string   `json:"remote"`
	Fetch      bool     `json:"fetch,omitempty"`
	Push       []string `json:"push,omitempty"`
	Force      bool     `json:"force,omitempty"`
	Delete     bool     `json:"delete,omitempty"`
	Credential string   `json:"credential,omitempty"`
}

// GitHubApp is an [[egress.github_apps]] entry: the proxy mints an
// installation token per run with it, restricted to the run's repositories.
// PrivateKey (PEM) is never marshalled; the proxy's stdin has its own form.
type GitHubApp struct {
	Name           string `json:"name"`
	AppID          int64  `json:"app_id"`
	InstallationID int64  `json:"installation_id"`
	// APIBaseURL is the API's root (GitHub's when empty; a fake in tests).
	APIBaseURL string `json:"api_base_url,omitempty"`
	PrivateKey string `json:"-"`
}

// GitHubAPI is GitHub's API root, for an app without APIBaseURL.
const GitHubAPI = "https://api.github.com"

// API is the app's API root, without a trailing slash.
func (a GitHubApp) API() string {
	if a.APIBaseURL == "" {
		return GitHubAPI
	}
	return strings.TrimSuffix(a.APIBaseURL, "/")
}

// GitRemote is a rule's remote taken apart: Repo is its path without a
// trailing ".git" or "/", perhaps a glob.
type GitRemote struct {
	Host string
	Port int
	Repo string
}

// URL is the remote as the reasons name it.
func (r GitRemote) URL() string {
	host := r.Host
	if r.Port != 443 {
		host += ":" + strconv.Itoa(r.Port)
	}
	return "https://" + host + r.Repo
}

// ParseGitRemote parses a rule's remote: an https URL with a host and a
// repository path, no user, query or fragment.
func ParseGitRemote(s string) (GitRemote, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return GitRemote{}, fmt.Errorf("remote %q is not an https URL of a repository (https://host/owner/repo.git)", s)
	}
	host, port := NormalHost(u.Hostname()), 443
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil || port < 1 || port > 65535 {
			return GitRemote{}, fmt.Errorf("remote %q: port %q is not 1-65535", s, p)
		}
	}
	if _, err := netip.ParseAddr(host); err != nil && (strings.Contains(host, "*") || !ValidHostname(host)) {
		return GitRemote{}, fmt.Errorf("remote %q: the host must be a name or an address, without a glob", s)
	}
	repo := gitRepoPath(u.EscapedPath())
	if repo == "" || !PlainPath(repo) || strings.Contains(repo, "%") {
		return GitRemote{}, fmt.Errorf("remote %q: the path must name a repository (plain segments, like /owner/repo.git)", s)
	}
	if _, err := path.Match(repo, ""); err != nil {
		return GitRemote{}, fmt.Errorf("remote %q: the path is not a valid glob", s)
	}
	return GitRemote{Host: host, Port: port, Repo: repo}, nil
}

// gitRepoPath is a repository path as rules compare it: no trailing "/"
// or ".git" (forges serve /o/r.git and /o/r alike).
func gitRepoPath(p string) string {
	p = strings.TrimSuffix(p, "/")
	return strings.TrimSuffix(p, ".git")
}

// Check says what is wrong with the rule, or nil.
func (r GitRule) Check() error {
	if _, err := ParseGitRemote(r.Remote); err != nil {
		return err
	}
	if !r.Fetch && len(r.Push) == 0 {
		return fmt.Errorf("git rule %s allows nothing: set fetch = true or push branches", r.Remote)
	}
	for _, g := range r.Push {
		b := strings.TrimPrefix(g, "refs/heads/")
		if _, err := path.Match(b, ""); err != nil || b == "" || strings.HasPrefix(b, "refs/") || strings.ContainsAny(b, " ~^:?[\\") {
			return fmt.Errorf("git rule %s: push %q is not a branch glob (like \"berth/*\")", r.Remote, g)
		}
	}
	if (r.Force || r.Delete) && len(r.Push) == 0 {
		return fmt.Errorf("git rule %s: force and delete need push branches", r.Remote)
	}
	return nil
}

func (r GitRule) remote() GitRemote {
	rem, _ := ParseGitRemote(r.Remote)
	return rem
}

// branches are the rule's push globs as branch names.
func (r GitRule) branches() []string {
	out := make([]string, len(r.Push))
	for i, g := range r.Push {
		out[i] = strings.TrimPrefix(g, "refs/heads/")
	}
	return out
}

// CheckGitRules checks rules and that each credential is one of names.
func CheckGitRules(rules []GitRule, credentials []string) error {
	var errs []error
	for _, r := range rules {
		if err := r.Check(); err != nil {
			errs = append(errs, err)
		}
		if r.Credential != "" && !slices.Contains(credentials, r.Credential) {
			errs = append(errs, fmt.Errorf("git rule %s: credential %q is neither an [[egress.secrets]] nor an [[egress.github_apps]] name", r.Remote, r.Credential))
		}
	}
	return errors.Join(errs...)
}

// GitHosts are the hosts git rules name: the proxy intercepts their TLS,
// so the run's CA must be made for them too.
func GitHosts(rules []GitRule) []string {
	var hosts []string
	for _, r := range rules {
		if h := r.remote().Host; h != "" && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// The two services of git's smart HTTP.
const (
	GitUploadPack  = "git-upload-pack"  // clone, fetch, ls-remote
	GitReceivePack = "git-receive-pack" // push
)

// GitRequest is one request of git's smart HTTP: the advertisement
// (GET <repo>/info/refs?service=<service>) or the service call
// (POST <repo>/<service>). Repo is the path as rules compare it.
type GitRequest struct {
	Service   string
	Repo      string
	Advertise bool
}

// ParseGitRequest says whether a request inside a tunnel is git's: ok is
// false for any other request; err says why a request shaped like git's
// is refused (a dumb-protocol read, an encoded path, a wrong method).
func ParseGitRequest(method, escapedPath, rawQuery string) (req GitRequest, ok bool, err error) {
	repo, tail, found := cutGitTail(escapedPath)
	if !found {
		return GitRequest{}, false, nil
	}
	if !PlainPath(escapedPath) || strings.Contains(escapedPath, "%") {
		return GitRequest{}, true, fmt.Errorf("git: the path %q is not plain (encoded or dot segments)", escapedPath)
	}
	req.Repo = gitRepoPath(repo)
	if req.Repo == "" || strings.HasSuffix(req.Repo, "/") {
		return GitRequest{}, true, errors.New("git: the request names no repository")
	}
	switch tail {
	case "/info/refs":
		q, _ := url.ParseQuery(rawQuery)
		if len(q["service"]) > 1 {
			// The backend may read another one than the proxy judged.
			return GitRequest{}, true, errors.New("git: info/refs names its service more than once")
		}
		req.Service, req.Advertise = q.Get("service"), true
		if method != http.MethodGet && method != http.MethodHead {
			return GitRequest{}, true, fmt.Errorf("git: %s of info/refs is not git's", method)
		}
		if req.Service != GitUploadPack && req.Service != GitReceivePack {
			return GitRequest{}, true, errors.New("git: only the smart protocol is let through (info/refs?service=git-upload-pack or git-receive-pack)")
		}
	default:
		req.Service = strings.TrimPrefix(tail, "/")
		if method != http.MethodPost {
			return GitRequest{}, true, fmt.Errorf("git: %s of %s is not git's", method, req.Service)
		}
	}
	return req, true, nil
}

// cutGitTail splits a smart-HTTP path into repository and service part.
func cutGitTail(p string) (repo, tail string, ok bool) {
	for _, t := range []string{"/info/refs", "/" + GitUploadPack, "/" + GitReceivePack} {
		if r, found := strings.CutSuffix(p, t); found {
			return r, t, true
		}
	}
	return "", "", false
}

// GitRule is the rule for host:port and repo: one whose path names repo
// exactly first, else the first whose glob matches.
func (j *Judge) GitRule(host string, port int, repo string) (GitRule, bool) {
	host = NormalHost(host)
	first := -1
	for i, r := range j.Git {
		rem := r.remote()
		if rem.Host != host || rem.Port != port {
			continue
		}
		if rem.Repo == repo {
			return r, true
		}
		if ok, _ := path.Match(rem.Repo, repo); ok && first < 0 {
			first = i
		}
	}
	if first < 0 {
		return GitRule{}, false
	}
	return j.Git[first], true
}

// GitHost says whether a git rule names host:port: the proxy intercepts
// its TLS to judge each git request.
func (j *Judge) GitHost(host string, port int) bool {
	host = NormalHost(host)
	for _, r := range j.Git {
		if rem := r.remote(); rem.Host == host && rem.Port == port {
			return true
		}
	}
	return false
}

// gitHostRule lets a CONNECT reach a host a git rule names (no allow rule
// needed): the proxy intercepts it and lets git's requests through only.
// The host is named exactly, as a rule naming it would.
func (j *Judge) gitHostRule(method, host string, port int) (Rule, bool) {
	if method != http.MethodConnect || !j.GitHost(host, port) {
		return Rule{}, false
	}
	for _, r := range j.Git {
		if rem := r.remote(); rem.Host == NormalHost(host) && rem.Port == port {
			return Rule{Raw: "git " + r.Remote, Host: rem.Host, Port: port, Methods: []string{http.MethodConnect}}, true
		}
	}
	return Rule{}, false
}

// GitCredential says whether name is the credential of a git rule: such a
// secret is added to its rules' git requests only, never by host.
func (j *Judge) GitCredential(name string) bool {
	return slices.ContainsFunc(j.Git, func(r GitRule) bool { return r.Credential == name })
}

// GitAccess judges a git request to host:port: the rule that allows it,
// or why not.
func (j *Judge) GitAccess(host string, port int, req GitRequest) (GitRule, *Refusal) {
	url := GitRemote{Host: NormalHost(host), Port: port, Repo: req.Repo}.URL()
	rule, ok := j.GitRule(host, port, req.Repo)
	if !ok {
		return GitRule{}, refused(http.StatusForbidden, "git: no [[agents.egress.git]] rule of agent %s names %s", j.Agent, url)
	}
	switch {
	case req.Service == GitUploadPack && !rule.Fetch:
		return GitRule{}, refused(http.StatusForbidden, "git: fetching %s is not allowed for agent %s (rule %s has fetch = false)", url, j.Agent, rule.Remote)
	case req.Service == GitReceivePack && len(rule.Push) == 0:
		return GitRule{}, refused(http.StatusForbidden, "git: pushing to %s is not allowed for agent %s (rule %s names no push branches)", url, j.Agent, rule.Remote)
	}
	return rule, nil
}

// RefUpdate is one command of a push: the ref's old and new object ids
// (all zeros for none) and its full name.
type RefUpdate struct {
	Old string `json:"old"`
	New string `json:"new"`
	Ref string `json:"ref"`
}

// ZeroID says whether id is git's null object id.
func ZeroID(id string) bool { return id != "" && strings.Trim(id, "0") == "" }

// Branch is the ref's short name as git prints it.
func (u RefUpdate) Branch() string {
	if b, ok := strings.CutPrefix(u.Ref, "refs/heads/"); ok {
		return b
	}
	return strings.TrimPrefix(u.Ref, "refs/tags/")
}

// GitPush judges one ref update of a push under rule: refused, or allowed
// and, when mustFastForward, only if old is an ancestor of new (which the
// proxy asks the pushed commits and the forge, never the client).
func (j *Judge) GitPush(rule GitRule, u RefUpdate) (mustFastForward bool, r *Refusal) {
	branch, isBranch := strings.CutPrefix(u.Ref, "refs/heads/")
	switch {
	case strings.HasPrefix(u.Ref, "refs/tags/"):
		return false, refused(http.StatusForbidden, "pushing tag %s is not allowed for agent %s: berth lets branches through only", u.Branch(), j.Agent)
	case !isBranch || branch == "":
		return false, refused(http.StatusForbidden, "pushing %s is not allowed for agent %s: berth lets branches (refs/heads/) through only", u.Ref, j.Agent)
	}
	allowed := slices.ContainsFunc(rule.branches(), func(g string) bool {
		ok, _ := path.Match(g, branch)
		return ok
	})
	if !allowed {
		return false, refused(http.StatusForbidden, "push to %s is not allowed for agent %s; allowed: %s", branch, j.Agent, strings.Join(rule.branches(), ", "))
	}
	if ZeroID(u.New) {
		if !rule.Delete {
			return false, refused(http.StatusForbidden, "deleting %s is not allowed for agent %s (delete = false)", branch, j.Agent)
		}
		return false, nil
	}
	return !ZeroID(u.Old) && !rule.Force, nil
}

// NotFastForward is the reason an update that is not a fast-forward is
// refused.
func (j *Judge) NotFastForward(u RefUpdate, why string) *Refusal {
	return refused(http.StatusForbidden, "%s: a non-fast-forward update is not allowed for agent %s (force = false): %s", u.Branch(), j.Agent, why)
}

// ExplainGit says what the proxy would decide for a git fetch of remote
// or a push of ref to it ("refs/heads/x" or a branch name), with the code
// the proxy decides with.
func (j *Judge) ExplainGit(op, remote, ref string) (Verdict, error) {
	v := Verdict{Method: "git " + op, URL: remote}
	rem, err := ParseGitRemote(remote)
	if err != nil {
		return v, err
	}
	if strings.Contains(rem.Repo, "*") {
		return v, fmt.Errorf("remote %q: explain one repository, not a glob", remote)
	}
	req := GitRequest{Repo: rem.Repo}
	switch op {
	case "fetch", "clone":
		req.Service = GitUploadPack
	case "push":
		req.Service = GitReceivePack
		if ref == "" {
			return v, errors.New("git push: name the ref pushed (refs/heads/<branch> or a branch)")
		}
		if !strings.HasPrefix(ref, "refs/") {
			ref = "refs/heads/" + ref
		}
	default:
		return v, fmt.Errorf("git %q: want fetch or push", op)
	}
	rule, r := j.GitAccess(rem.Host, rem.Port, req)
	if r != nil {
		v.Reason = r.Reason
		return v, nil
	}
	v.Rule = "git " + rule.Remote
	if op != "push" {
		v.Allowed, v.Reason = true, fmt.Sprintf("a fetch of %s, allowed by git rule %s", rem.URL(), rule.Remote)
		v.Note = credentialNote(rule)
		return v, nil
	}
	u := RefUpdate{Old: "1", New: "1", Ref: ref}
	ff, r := j.GitPush(rule, u)
	if r != nil {
		v.Reason = r.Reason
		return v, nil
	}
	v.Allowed, v.Reason = true, fmt.Sprintf("a push to %s of %s, allowed by git rule %s", rem.URL(), u.Branch(), rule.Remote)
	if ff {
		v.Note = "only a fast-forward (force = false): the proxy judges the ancestry from the pushed commits and the forge, not from the client"
	}
	if !rule.Delete {
		v.Note = joinNote(v.Note, "deleting it is refused (delete = false)")
	}
	v.Note = joinNote(v.Note, credentialNote(rule))
	return v, nil
}

// gitHostNote is what explain says of a tunnel to a git rule's host.
func gitHostNote(j *Judge, host string, port int) string {
	if _, ok := MatchRule(j.Allow, http.MethodConnect, host, port); ok {
		return "TLS intercepted with the run's CA: git's requests are judged by the git rules, others pass without their credentials"
	}
	return "TLS intercepted with the run's CA: only git's smart HTTP for the repositories of the git rules passes"
}

func credentialNote(r GitRule) string {
	if r.Credential == "" {
		return "sent without a credential (the rule names none)"
	}
	return fmt.Sprintf("credential %s is added by the proxy on this repository's requests only", r.Credential)
}
