package config

import "slices"

// sandboxKeysSet tells whether agent id's [agents.sandbox] or
// [agent_defaults.sandbox] sets a key that only scope "conversation" uses,
// so config check can say it is ignored.
func (c *Config) sandboxKeysSet(id string) bool {
	set := func(s SandboxSettings) bool {
		return s.IdleStop != nil || s.MaxLifetime != nil || s.MaxPerAgent != nil
	}
	i := slices.IndexFunc(c.Agents, func(a AgentSettings) bool { return a.ID == id })
	return set(c.AgentDefaults.Sandbox) || (i >= 0 && set(c.Agents[i].Sandbox))
}
