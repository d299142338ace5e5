package ctl

import (
	"strings"
	"testing"
)

const gitToken = "ghp_ctlGitTokenValue0815"

const egressGitConfig = sandboxConfig + `
[[egress.secrets]]
name  = "gh"
env   = "GH_TOKEN"
hosts = ["github.com"]

[[agents]]
id = "web"
provider = "local"
[agents.file_access]
allow_network = false
[[agents.egress.git]]
remote     = "https://github.com/acme/web.git"
fetch      = true
push       = ["berth/*"]
credential = "gh"
`

// berthctl egress explain --git asks the running scheduler, which judges
// with the git rules the agent's next run would hand its proxy.
func TestGitExplainAnswersFromTheAgentsGitRulesThroughTheScheduler(t *testing.T) {
	t.Parallel()
	conn, _ := schedulerOnBus(t, egressGitConfig, map[string]string{"CLOUD_KEY": sandboxSecret, "GH_TOKEN": gitToken})
	tests := []struct {
		name   string
		args   []string
		code   int
		golden string
		want   []string
	}{
		{"A_push_to_main_is_refused_with_the_proxy's_reason", []string{"--git", "push", "web", "https://github.com/acme/web.git", "refs/heads/main"}, ExitFailed,
			"egress_explain_git_push_refused.txt", nil},
		{"A_push_to_an_allowed_branch_passes_fast-forward_only", []string{"--git", "push", "web", "https://github.com/acme/web.git", "berth/fix"}, ExitOK,
			"egress_explain_git_push_allowed.txt", nil},
		{"A_fetch_of_the_rule's_repository_passes", []string{"web", "https://github.com/acme/web.git", "--git", "fetch"}, ExitOK,
			"", []string{"verdict:  ALLOWED by rule git https://github.com/acme/web.git", "credential gh is added by the proxy on this repository's requests only"}},
		{"A_fetch_of_another_repository_is_refused", []string{"--git", "fetch", "web", "https://github.com/acme/other.git"}, ExitFailed,
			"", []string{"git: no [[agents.egress.git]] rule of agent web names https://github.com/acme/other"}},
		{"A_direct_network_passes_unfiltered", []string{"--git", "fetch", "ops", "https://github.com/acme/web.git"}, ExitOK,
			"", []string{"PASSES, unfiltered (DIRECT network", "without the egress proxy and its git rules"}},
		{"A_push_without_a_ref_is_a_usage_error", []string{"--git", "push", "web", "https://github.com/acme/web.git"}, ExitUsage,
			"", []string{"usage: berthctl egress explain"}},
		{"A_glob_remote_exits_2", []string{"--git", "fetch", "web", "https://github.com/acme/*"}, ExitUsage,
			"", []string{"explain one repository, not a glob"}},
		{"An_unknown_operation_exits_2", []string{"--git", "clone", "web", "https://github.com/acme/web.git"}, ExitUsage,
			"", []string{`--git "clone": want fetch or push`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, code := berthctl(conn, append([]string{"egress", "explain"}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\n%s", code, tc.code, out)
			}
			if tc.golden != "" {
				golden(t, tc.golden, []byte(out))
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, gitToken) || strings.Contains(out, sandboxSecret) {
				t.Errorf("output holds a credential:\n%s", out)
			}
		})
	}
}
