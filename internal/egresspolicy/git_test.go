package egresspolicy

import (
	"strings"
	"testing"
)

var gitJudge = &Judge{Agent: "web", Git: []GitRule{
	{Remote: "https://forge.test/acme/web.git", Fetch: true, Push: []string{"berth/*"}, Credential: "github"},
	{Remote: "https://forge.test/acme/docs-*", Fetch: true},
	{Remote: "https://forge.test/acme/wiki", Fetch: true, Push: []string{"notes"}, Force: true, Delete: true},
}}

func TestGitRequestsAreToldFromOthers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, method, path, query string
		want                      GitRequest
		git                       bool
		err                       string
	}{
		{"Fetch_advertisement", "GET", "/acme/web.git/info/refs", "service=git-upload-pack", GitRequest{GitUploadPack, "/acme/web", true}, true, ""},
		{"Fetch_call_without_dot_git", "POST", "/acme/web/git-upload-pack", "", GitRequest{GitUploadPack, "/acme/web", false}, true, ""},
		{"Push_call", "POST", "/acme/web.git/git-receive-pack", "", GitRequest{GitReceivePack, "/acme/web", false}, true, ""},
		{"Not_git", "GET", "/acme/web/pulls", "", GitRequest{}, false, ""},
		{"Dumb_protocol_is_refused", "GET", "/acme/web.git/info/refs", "", GitRequest{}, true, "only the smart protocol"},
		{"Encoded_path_is_refused", "GET", "/acme/w%65b.git/info/refs", "service=git-upload-pack", GitRequest{}, true, "not plain"},
		{"Dot_segments_are_refused", "POST", "/acme/other/../web.git/git-receive-pack", "", GitRequest{}, true, "not plain"},
		{"Service_named_twice_is_refused", "GET", "/acme/web.git/info/refs", "service=git-upload-pack&service=git-receive-pack", GitRequest{}, true, "more than once"},
		{"Empty_repository_name_is_refused", "GET", "/acme/.git/info/refs", "service=git-upload-pack", GitRequest{}, true, "names no repository"},
		{"GET_of_a_service_is_refused", "GET", "/acme/web.git/git-receive-pack", "", GitRequest{}, true, "not git's"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, git, err := ParseGitRequest(tt.method, tt.path, tt.query)
			if git != tt.git || (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) || err == nil && got != tt.want {
				t.Errorf("ParseGitRequest = %+v, %v, %v; want %+v, %v, %q", got, git, err, tt.want, tt.git, tt.err)
			}
		})
	}
}

func TestGitAccessIsByRepository(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		host    string
		req     GitRequest
		rule    string
		refusal string
	}{
		{"Named_repository_fetch", "forge.test", GitRequest{Service: GitUploadPack, Repo: "/acme/web"}, "https://forge.test/acme/web.git", ""},
		{"Glob_repository_fetch", "forge.test", GitRequest{Service: GitUploadPack, Repo: "/acme/docs-api"}, "https://forge.test/acme/docs-*", ""},
		{"Glob_stays_in_its_segment", "forge.test", GitRequest{Service: GitUploadPack, Repo: "/acme/docs-api/x"}, "", "no [[agents.egress.git]] rule of agent web names https://forge.test/acme/docs-api/x"},
		{"Other_repository", "forge.test", GitRequest{Service: GitUploadPack, Repo: "/acme/other"}, "", "names https://forge.test/acme/other"},
		{"Other_host", "other.test", GitRequest{Service: GitUploadPack, Repo: "/acme/web"}, "", "names https://other.test/acme/web"},
		{"Push_where_the_rule_has_no_branches", "forge.test", GitRequest{Service: GitReceivePack, Repo: "/acme/docs-api"}, "", "names no push branches"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rule, r := gitJudge.GitAccess(tt.host, 443, tt.req)
			if tt.refusal == "" && (r != nil || rule.Remote != tt.rule) || tt.refusal != "" && (r == nil || !strings.Contains(r.Reason, tt.refusal)) {
				t.Errorf("GitAccess = %+v, %v; want rule %q, refusal %q", rule, r, tt.rule, tt.refusal)
			}
		})
	}
}

func TestGitPushesAreJudgedByRef(t *testing.T) {
	t.Parallel()
	const a, b, zero = "1111111111111111111111111111111111111111", "2222222222222222222222222222222222222222", "0000000000000000000000000000000000000000"
	web, wiki := gitJudge.Git[0], gitJudge.Git[2]
	tests := []struct {
		name    string
		rule    GitRule
		u       RefUpdate
		ff      bool
		refusal string
	}{
		{"New_branch_of_the_glob", web, RefUpdate{zero, b, "refs/heads/berth/x"}, false, ""},
		{"Update_must_be_a_fast_forward", web, RefUpdate{a, b, "refs/heads/berth/x"}, true, ""},
		{"Main_is_refused_with_the_allowed_branches", web, RefUpdate{a, b, "refs/heads/main"}, false, "push to main is not allowed for agent web; allowed: berth/*"},
		{"Glob_stays_in_its_segment", web, RefUpdate{zero, b, "refs/heads/berth/x/y"}, false, "push to berth/x/y is not allowed"},
		{"Deletion_without_delete", web, RefUpdate{a, zero, "refs/heads/berth/x"}, false, "deleting berth/x is not allowed for agent web (delete = false)"},
		{"Tag", web, RefUpdate{zero, b, "refs/tags/berth/v1"}, false, "pushing tag berth/v1 is not allowed"},
		{"Other_refs", web, RefUpdate{zero, b, "refs/notes/commits"}, false, "branches (refs/heads/) through only"},
		{"Force_lets_any_update_through", wiki, RefUpdate{a, b, "refs/heads/notes"}, false, ""},
		{"Delete_lets_a_deletion_through", wiki, RefUpdate{a, zero, "refs/heads/notes"}, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ff, r := gitJudge.GitPush(tt.rule, tt.u)
			if ff != tt.ff || tt.refusal == "" && r != nil || tt.refusal != "" && (r == nil || !strings.Contains(r.Reason, tt.refusal)) {
				t.Errorf("GitPush = %v, %v; want %v, %q", ff, r, tt.ff, tt.refusal)
			}
		})
	}
}

func TestGitRulesAreChecked(t *testing.T) {
	t.Parallel()
	tests := []struct {
		rule GitRule
		err  string
	}{
		{GitRule{Remote: "https://forge.test/acme/web.git", Fetch: true, Credential: "github"}, ""},
		{GitRule{Remote: "http://forge.test/acme/web.git", Fetch: true}, "not an https URL"},
		{GitRule{Remote: "https://*.forge.test/acme/web.git", Fetch: true}, "without a glob"},
		{GitRule{Remote: "https://forge.test/", Fetch: true}, "must name a repository"},
		{GitRule{Remote: "https://forge.test/acme/web", Push: []string{"refs/tags/*"}}, "not a branch glob"},
		{GitRule{Remote: "https://forge.test/acme/web"}, "allows nothing"},
		{GitRule{Remote: "https://forge.test/acme/web", Fetch: true, Force: true}, "need push branches"},
		{GitRule{Remote: "https://forge.test/acme/web", Fetch: true, Credential: "nope"}, `credential "nope" is neither`},
	}
	for _, tt := range tests {
		err := CheckGitRules([]GitRule{tt.rule}, []string{"github"})
		if (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) {
			t.Errorf("CheckGitRules(%+v) = %v; want %q", tt.rule, err, tt.err)
		}
	}
}

func TestGitExplainAnswersWithTheProxysRules(t *testing.T) {
	t.Parallel()
	v, err := gitJudge.ExplainGit("push", "https://forge.test/acme/web.git", "refs/heads/main")
	if err != nil || v.Allowed || v.Reason != "push to main is not allowed for agent web; allowed: berth/*" {
		t.Errorf("push to main: %+v, %v", v, err)
	}
	v, err = gitJudge.ExplainGit("push", "https://forge.test/acme/web.git", "berth/x")
	if err != nil || !v.Allowed || !strings.Contains(v.Note, "only a fast-forward") || !strings.Contains(v.Note, "credential github") {
		t.Errorf("push to berth/x: %+v, %v", v, err)
	}
	v, err = gitJudge.ExplainGit("fetch", "https://forge.test/acme/other.git", "")
	if err != nil || v.Allowed || !strings.Contains(v.Reason, "no [[agents.egress.git]] rule") {
		t.Errorf("fetch of another repository: %+v, %v", v, err)
	}
	// The host of a git rule is reached for git only: CONNECT is allowed,
	// by the git rule, when no allow rule names it.
	dest, r := gitJudge.Destination(t.Context(), "CONNECT", "forge.test", 443)
	if r != nil || dest.Rule.Raw != "git https://forge.test/acme/web.git" {
		t.Errorf("CONNECT to the git host: %+v, %v", dest, r)
	}
	v, err = gitJudge.Explain(t.Context(), Question{Method: "GET", URL: "https://forge.test/acme/web/pulls"})
	if err != nil || !v.Allowed || !strings.Contains(v.Note, "only git's smart HTTP") {
		t.Errorf("explain of the git host: %+v, %v; want the tunnel allowed for git only", v, err)
	}
	if _, r := gitJudge.Destination(t.Context(), "GET", "forge.test", 80); r == nil {
		t.Error("plain HTTP to the git host was allowed")
	}
}
