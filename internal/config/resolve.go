package config

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
)

// AgentIDs returns the configured agent ids in the order they were defined.
func (c *Config) AgentIDs() []string {
	ids := make([]string, 0, len(c.Agents))
	for _, a := range c.Agents {
		ids = append(ids, a.ID)
	}
	return ids
}

// Agent returns an agent's effective settings: each one from the agent,
// else from [agent_defaults], else the built-in default.
func (c *Config) Agent(id string) (Agent, error) {
	i := slices.IndexFunc(c.Agents, func(a AgentSettings) bool { return a.ID == id })
	if i < 0 {
		known := strings.Join(c.AgentIDs(), ", ")
		if known == "" {
			known = "none"
		}
		return Agent{}, fmt.Errorf("unknown agent %q (configured: %s)", id, known)
	}
	s, d := &c.Agents[i], &c.AgentDefaults
	sc, dc := &s.ContainerMode, &d.ContainerMode
	sf, df := &s.FileAccess, &d.FileAccess

	defaultProvider := c.Providers.Primary
	if defaultProvider == "" {
		defaultProvider = localProvider
	}
	a := Agent{
		ID:            id,
		Name:          first(s.Name, d.Name, id),
		Workspace:     first(s.Workspace, d.Workspace),
		Provider:      first(s.Provider, d.Provider, defaultProvider),
		Model:         first(s.Model, d.Model),
		MaxIterations: firstSet(defaultMaxIterations, s.MaxIterations, d.MaxIterations),
		Tools: ToolsSettings{
			Allow: firstList(s.Tools.Allow, d.Tools.Allow),
			Deny:  firstList(s.Tools.Deny, d.Tools.Deny),
			Ask:   firstList(s.Tools.Ask, d.Tools.Ask),
		},
		Container: Container{
			Enabled:     firstSet(false, sc.Enabled, dc.Enabled),
			Image:       first(sc.Image, dc.Image),
			MemoryLimit: firstSet(DefaultMemoryLimit, sc.MemoryLimit, dc.MemoryLimit),
			Network:     string(first(sc.Network, dc.Network, defaultNetwork)),
			Runtime:     first(sc.Runtime, dc.Runtime),
			Warm:        firstSet(0, sc.Warm, dc.Warm),
			Binds:       firstList(sc.Binds, dc.Binds),
			SecurityOpt: firstList(sc.SecurityOpt, dc.SecurityOpt),
		},
		FileAccess: FileAccess{
			Unrestricted:      firstSet(false, sf.Unrestricted, df.Unrestricted),
			AllowRead:         firstList(sf.AllowRead, df.AllowRead),
			AllowReadWrite:    firstList(sf.AllowReadWrite, df.AllowReadWrite),
			Deny:              firstList(sf.Deny, df.Deny),
			AllowHomeDotfiles: firstSet(false, sf.AllowHomeDotfiles, df.AllowHomeDotfiles),
			AllowNetwork:      firstSet(false, sf.AllowNetwork, df.AllowNetwork),
		},
		EgressAllow: firstList(s.Egress.Allow, d.Egress.Allow),
		EgressAsk:   firstList(s.Egress.Ask, d.Egress.Ask),
		EgressApprovalTimeout: time.Duration(firstSet(Duration(egresspolicy.DefaultApprovalTimeout),
			s.Egress.ApprovalTimeout, d.Egress.ApprovalTimeout)),
		EgressGit:      gitRulesOf(s.Egress.Git, d.Egress.Git),
		WorkspaceQuota: firstSet(defaultWorkspaceQuota, s.WorkspaceQuota, d.WorkspaceQuota),
		Timeout:        time.Duration(firstSet(0, sc.TimeoutSeconds, dc.TimeoutSeconds)) * time.Second,
		Image:          c.image(&s.ImageConfig),
		Sandbox: Sandbox{
			Scope:       first(s.Sandbox.Scope, d.Sandbox.Scope, SandboxScopeMessage),
			IdleStop:    time.Duration(firstSet(defaultSandboxIdleStop, s.Sandbox.IdleStop, d.Sandbox.IdleStop)),
			MaxLifetime: time.Duration(firstSet(defaultSandboxMaxLifetime, s.Sandbox.MaxLifetime, d.Sandbox.MaxLifetime)),
			MaxPerAgent: firstSet(defaultSandboxMaxPerAgent, s.Sandbox.MaxPerAgent, d.Sandbox.MaxPerAgent),
		},
		MCP:       mcpOf(s.MCP, d.MCP),
		WebSearch: webSearchOf(&s.WebSearch, &d.WebSearch),
		Budget:    budgetOf(&s.Budget, &d.Budget),
		// Validated: "" or egresspolicy.ModeReadOnly.
		EgressReadOnly: first(s.Egress.Mode, d.Egress.Mode) == egresspolicy.ModeReadOnly,
	}
	if a.Timeout == 0 {
		// Defaulted where the Config was resolved (tree.config); a Config
		// built in code starts from Defaults.
		a.Timeout = c.Scheduler.DefaultTimeout
	}
	switch {
	case first(s.Backend, d.Backend) == BackendKubernetes:
		a.Isolation = BackendKubernetes
	case a.Container.Enabled:
		a.Isolation = "container"
	case a.FileAccess.Unrestricted:
		a.Isolation = "unrestricted"
	default:
		a.Isolation = "landlock"
	}
	return a, nil
}

// image resolves an agent's image_config: the agent's key, else the global
// [image_config] key, else the built-in default.
func (c *Config) image(s *ImageSettings) ImageConfig {
	g := &c.ImageConfig
	vars := s.EnvVars
	if vars == nil {
		vars = g.EnvVars
	}
	return ImageConfig{
		Enabled:   firstSet(false, s.Enabled, g.Enabled),
		Image:     first(s.Image, g.Image),
		BaseImage: first(s.BaseImage, g.BaseImage, DefaultBaseImage),
		Packages:  firstList(s.Packages, g.Packages),
		EnvVars:   maps.Clone(vars),
	}
}

// first returns the first non-empty string.
func first[S ~string](values ...S) S {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}

// firstSet returns the first value that is set, else def.
func firstSet[T any](def T, values ...*T) T {
	for _, v := range values {
		if v != nil {
			return *v
		}
	}
	return def
}

// firstList returns a copy of the first list that is set: an agent's list
// replaces the defaults' list, even when empty.
func firstList(lists ...[]string) []string {
	for _, l := range lists {
		if l != nil {
			return slices.Clone(l)
		}
	}
	return nil
}

// Connector returns the connector with the given id.
func (c *Config) Connector(id string) (Connector, bool) {
	for _, k := range c.Connectors {
		if k.ID == id {
			return k, true
		}
	}
	return Connector{}, false
}

// ConnectorSecret returns a connector's secret: secret_file's content
// without its trailing newline, else secret.
func (c *Config) ConnectorSecret(id string) ([]byte, error) {
	k, ok := c.Connector(id)
	if !ok {
		return nil, fmt.Errorf("unknown connector %q", id)
	}
	if k.SecretFile == "" {
		if k.Secret == "" {
			return nil, fmt.Errorf("connector %q has no secret", id)
		}
		return []byte(k.Secret), nil
	}
	data, err := os.ReadFile(k.SecretFile)
	if err != nil {
		return nil, fmt.Errorf("cannot read secret of connector %q: %w", id, err)
	}
	data = bytes.TrimRight(data, "\r\n")
	if len(data) == 0 {
		return nil, fmt.Errorf("secret file %s of connector %q is empty", k.SecretFile, id)
	}
	return data, nil
}

// Route is RouteMessage for a message without a server (webhooks).
func (c *Config) Route(connector, channelID, channelName string) (string, error) {
	return c.RouteMessage(connector, channelID, channelName, "")
}

// RouteMessage returns the agent for a message on a connector's channel, in
// this order: the first binding for that exact channel_id, else the first
// binding whose channel_name glob matches, else the first binding for the
// message's server_id (MeepaChat server, Discord guild, Slack team) that
// names no channel, else the connector's default agent, else [intake]
// default_agent. A binding without connector matches every connector; a
// binding's server_id, when set, also narrows its channel_id and
// channel_name to that server.
func (c *Config) RouteMessage(connector, channelID, channelName, serverID string) (string, error) {
	candidates := make([]Binding, 0, len(c.Bindings))
	for _, b := range c.Bindings {
		if (b.Connector == "" || b.Connector == connector) && (b.ServerID == "" || b.ServerID == serverID) {
			candidates = append(candidates, b)
		}
	}
	if channelID != "" {
		for _, b := range candidates {
			if b.ChannelID == channelID {
				return b.Agent, nil
			}
		}
	}
	for _, b := range candidates {
		if b.ChannelName != "" {
			if ok, _ := path.Match(b.ChannelName, channelName); ok {
				return b.Agent, nil
			}
		}
	}
	if serverID != "" {
		for _, b := range candidates {
			if b.ServerID == serverID && b.ChannelID == "" && b.ChannelName == "" {
				return b.Agent, nil
			}
		}
	}
	if k, ok := c.Connector(connector); ok && k.DefaultAgent != "" {
		return k.DefaultAgent, nil
	}
	if c.Intake.DefaultAgent != "" {
		return c.Intake.DefaultAgent, nil
	}
	where := fmt.Sprintf("channel %q (%s)", channelID, channelName)
	if serverID != "" {
		where += fmt.Sprintf(" of server %q", serverID)
	}
	return "", fmt.Errorf("no agent for %s of connector %q: no binding matches and no default_agent is set", where, connector)
}

// ProviderChain returns the providers an agent calls, in order: its own
// provider (with the agent's model override) and then [providers] fallback,
// without repeats. Keys are read with getenv from each provider's
// api_key_env; a missing key is an error that names the variable.
func (c *Config) ProviderChain(a Agent, getenv func(string) string) ([]agentproto.Provider, error) {
	names := c.chainNames(a)
	chain := make([]agentproto.Provider, 0, len(names))
	for i, name := range names {
		p, ok := c.Providers.Entries[name]
		if !ok && name == localProvider {
			p, ok = Provider{Name: localProvider, Kind: "local"}, true
		}
		if !ok {
			return nil, fmt.Errorf("agent %q: provider %q is not defined", a.ID, name)
		}
		kind := first(p.Kind, name)
		ap := agentproto.Provider{Name: name, Kind: kind, BaseURL: p.BaseURL, Model: p.Model, MaxTokens: p.MaxTokens}
		if i == 0 && a.Model != "" {
			ap.Model = a.Model
		}
		if p.APIKeyEnv != "" {
			ap.Key = getenv(p.APIKeyEnv)
			if ap.Key == "" && kind != "local" {
				return nil, fmt.Errorf("agent %q: provider %q: environment variable %s is not set", a.ID, name, p.APIKeyEnv)
			}
		}
		chain = append(chain, ap)
	}
	return chain, nil
}

// chainNames lists the names of an agent's provider chain: its provider,
// then the fallbacks it does not repeat.
func (c *Config) chainNames(a Agent) []string {
	names := []string{a.Provider}
	for _, n := range c.Providers.Fallback {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names
}
