package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// ApproverSettings is one [[approvers]] entry: the people who may decide,
// in the chat, what the agent's runs ask (issue 26). Users are
// platform-prefixed user ids as the platform's signed events name them:
// "slack:U012345", "discord:812345678901234567", "meepachat:usr-…",
// "webhook:<author>"; or a group: "discord:role:<role id>",
// "slack:usergroup:<id>". Agent is an agent id, or "*" for every agent. An agent
// no entry names has no approvers in the chat: only admins decide
// (berthctl approvals, Cockpit). Several entries for one agent add up.
type ApproverSettings struct {
	Agent string   `toml:"agent" berth:"check=nonEmpty"`
	Users []string `toml:"users" berth:"check=approverUser"`
}

// Approvers are the resolved [[approvers]]: agent id ("*" for all) →
// platform-prefixed user ids.
type Approvers map[string][]string

// approverPlatforms are the prefixes an approver's user id takes: the
// connector types.
var approverPlatforms = []string{ConnectorSlack, ConnectorDiscord, ConnectorMeepaChat, ConnectorWebhook}

// MayApprove reports whether user (platform-prefixed, "slack:U012345"),
// or one of groups the platform puts them in ("discord:role:<id>",
// "slack:usergroup:<id>"), may decide the approvals of agent. A group
// counts only for a named user of the same platform, and a user id shaped
// as a group's counts for nothing, so one never passes for the other.
func (c *Config) MayApprove(agent, user string, groups ...string) bool {
	platform, id, _ := strings.Cut(user, ":")
	if id == "" || isGroup(id) {
		return false
	}
	if c.named(agent, user) {
		return true
	}
	for _, g := range groups {
		p, gid, _ := strings.Cut(g, ":")
		if p == platform && isGroup(gid) && c.named(agent, g) {
			return true
		}
	}
	return false
}

// named reports whether [[approvers]] name who (a user or a group) for
// agent, or for every agent.
func (c *Config) named(agent, who string) bool {
	return slices.Contains(c.Approvers[agent], who) || slices.Contains(c.Approvers["*"], who)
}

// isGroup reports whether a platform id names a group ("role:<id>",
// "usergroup:<id>"), as no user id does.
func isGroup(id string) bool {
	return strings.HasPrefix(id, "role:") || strings.HasPrefix(id, "usergroup:")
}

// HasApprovers reports whether anyone may decide agent's approvals in the
// chat.
func (c *Config) HasApprovers(agent string) bool {
	return len(c.Approvers[agent]) > 0 || len(c.Approvers["*"]) > 0
}

var approverChecks = map[string]any{
	"approverUser": func(s string) string {
		platform, id, ok := strings.Cut(s, ":")
		if !ok || !slices.Contains(approverPlatforms, platform) {
			return fmt.Sprintf("%q is not a platform-prefixed user id: want one of %s, a colon and the platform's user id (e.g. slack:U012345)", s, strings.Join(approverPlatforms, ", "))
		}
		if id == "" || strings.TrimSpace(id) != id || strings.ContainsAny(id, " \t\r\n") {
			return fmt.Sprintf("%q has no user id after %s: (or has spaces in it)", s, platform)
		}
		return ""
	},
}

// approversMerged checks that each [[approvers]] entry names an agent that
// exists and at least one user.
func (t *tree) approversMerged(c *checks) {
	agents := map[string]bool{"*": true}
	for _, a := range t.v.Agents {
		agents[a.v.ID] = true
	}
	for _, e := range t.v.Approvers {
		l, ok := e.at["agent"]
		if !ok {
			c.fail(where(e.at, e.self, "agent"), "is required (an agent id, or \"*\" for every agent)")
		} else if !agents[e.v.Agent] {
			c.fail(l, "agent %q is not defined (defined: %s, or \"*\")", e.v.Agent, strings.Join(t.agentIDs(), ", "))
		}
		if len(e.v.Users) == 0 {
			c.fail(where(e.at, e.self, "users"), "is required: the platform-prefixed user ids who may decide (e.g. [\"slack:U012345\"])")
		}
	}
}

// resolveApprovers is the merged [[approvers]] by agent.
func (t *tree) resolveApprovers() Approvers {
	if len(t.v.Approvers) == 0 {
		return nil
	}
	out := Approvers{}
	for _, e := range t.v.Approvers {
		for _, u := range e.v.Users {
			if !slices.Contains(out[e.v.Agent], u) {
				out[e.v.Agent] = append(out[e.v.Agent], u)
			}
		}
	}
	return out
}

func init() { maps.Copy(valueChecks, approverChecks) }
