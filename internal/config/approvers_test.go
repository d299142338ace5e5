package config_test

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
)

const approversBase = `
[[agents]]
id = "asker"

[[agents]]
id = "other"
`

func TestApproversAreWhoMayDecideAnAgentsApprovals(t *testing.T) {
	t.Parallel()
	c := load(t, approversBase+`
[[approvers]]
agent = "asker"
users = ["slack:U012345", "discord:812345678901234567"]

[[approvers]]
agent = "asker"
users = ["meepachat:usr-7", "slack:U012345"]

[[approvers]]
agent = "*"
users = ["webhook:ops-bot"]
`)
	tests := []struct {
		agent, user string
		want        bool
	}{
		{"asker", "slack:U012345", true},
		{"asker", "discord:812345678901234567", true},
		{"asker", "meepachat:usr-7", true}, // a second entry adds up
		{"other", "webhook:ops-bot", true}, // "*" is every agent
		{"asker", "webhook:ops-bot", true},
		{"other", "slack:U012345", false},     // named for asker only
		{"asker", "discord:U012345", false},   // the same id on another platform
		{"asker", "slack:u012345", false},     // ids are exact
		{"asker", "slack:", false},            // no id
		{"asker", "", false},                  // nobody
		{"asker", "U012345", false},           // no platform
		{"asker", "slack:U012345 ", false},    // not trimmed into a match
		{"unknown", "slack:U012345", false},   // no such agent
		{"asker", "slack:U0123456", false},    // a prefix is not the id
		{"asker", "meepachat:usr-7\n", false}, // nor a line
		{"other", "meepachat:usr-7", false},   // nor another agent's
		{"asker", "discord:81234567890123456", false},
	}
	for _, tc := range tests {
		if got := c.MayApprove(tc.agent, tc.user); got != tc.want {
			t.Errorf("MayApprove(%q, %q) = %v, want %v", tc.agent, tc.user, got, tc.want)
		}
	}
	if !c.HasApprovers("other") || !c.HasApprovers("asker") {
		t.Error("HasApprovers is false for an agent with approvers")
	}
	groups := load(t, approversBase+`
[[approvers]]
agent = "asker"
users = ["discord:role:700", "slack:usergroup:S0OPS"]
`)
	for _, tc := range []struct {
		user   string
		groups []string
		want   bool
	}{
		{"discord:900", []string{"discord:role:700"}, true},
		{"slack:U9", []string{"slack:usergroup:S0DEV", "slack:usergroup:S0OPS"}, true},
		{"discord:900", []string{"discord:role:701"}, false},      // another role
		{"discord:900", []string{"slack:usergroup:S0OPS"}, false}, // another platform's group
		{"discord:role:700", nil, false},                          // a user id shaped as the group
		{"", []string{"discord:role:700"}, false},                 // nobody named
		{"discord:900", []string{"discord:700"}, false},           // a group without its kind
	} {
		if got := groups.MayApprove("asker", tc.user, tc.groups...); got != tc.want {
			t.Errorf("MayApprove(asker, %q, %v) = %v, want %v", tc.user, tc.groups, got, tc.want)
		}
	}
	if none := load(t, approversBase); none.HasApprovers("asker") || none.MayApprove("asker", "slack:U012345") {
		t.Error("without [[approvers]] someone may decide in the chat")
	}
}

func TestBadApproversNameFileLineAndKey(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, entry, want string }{
		{"Error_when_a_user_has_no_platform", `
[[approvers]]
agent = "asker"
users = ["U012345"]
`, `berth.toml:10: approvers[0].users[0]: "U012345" is not a platform-prefixed user id`},
		{"Error_when_the_platform_is_unknown", `
[[approvers]]
agent = "asker"
users = ["slack:U1", "irc:bob"]
`, `berth.toml:10: approvers[0].users[1]: "irc:bob" is not a platform-prefixed user id`},
		{"Error_when_the_id_is_empty", `
[[approvers]]
agent = "asker"
users = ["slack:"]
`, `berth.toml:10: approvers[0].users[0]: "slack:" has no user id`},
		{"Error_when_the_agent_is_not_defined", `
[[approvers]]
agent = "gone"
users = ["slack:U1"]
`, `berth.toml:9: approvers[0].agent: agent "gone" is not defined (defined: asker, other, or "*")`},
		{"Error_when_the_agent_is_missing", `
[[approvers]]
users = ["slack:U1"]
`, `approvers[0].agent: is required`},
		{"Error_when_there_are_no_users", `
[[approvers]]
agent = "asker"
`, `approvers[0].users: is required`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, map[string]string{"berth.toml": approversBase + tc.entry})
			_, err := config.Load(path)
			if err == nil {
				t.Fatal("Load succeeded")
			}
			lines := errorLines(t, err, path)
			if len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
				t.Fatalf("errors =\n%s\nwant one containing\n%s", strings.Join(lines, "\n"), tc.want)
			}
		})
	}
}
