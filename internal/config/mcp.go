package config

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// MCPServer is one [[agents.mcp]] entry (also in [agent_defaults]): an MCP
// server the agent's runs reach over stdio (Command, started inside the
// sandbox) or streamable HTTP (URL, through the egress proxy only).
type MCPServer struct {
	// Name makes the server's tools mcp__<Name>__<tool>.
	Name    string   `toml:"name" berth:"check=mcpName"`
	Command []string `toml:"command" berth:"check=nonEmpty"`
	URL     string   `toml:"url" berth:"check=mcpURL"`
	// Tools, when set, are the server's tools (bare names) the agent may call.
	Tools []string `toml:"tools" berth:"check=mcpTool"`
	// HeadersSecret names the [[egress.secrets]] entry the proxy adds to
	// the server's requests; the sandbox never holds it.
	HeadersSecret string `toml:"headers_secret" berth:"check=nonEmpty"`
	// Timeout bounds the server's start and each call; nil is the agent's
	// default (30s).
	Timeout *Duration `toml:"timeout" berth:"check=mcpTimeout"`
}

// Web search providers ([agents.web_search] provider).
const (
	WebSearchSearXNG = "searxng"
	WebSearchBrave   = "brave"
)

// DefaultBraveBaseURL is where provider "brave" searches without base_url.
const DefaultBraveBaseURL = "https://api.search.brave.com"

// webSearchPaths are the paths under base_url each provider's searches
// ask, as berth-agent's web_search does.
var webSearchPaths = map[string]string{
	WebSearchSearXNG: "/search",
	WebSearchBrave:   "/res/v1/web/search",
}

// braveKeyHeader is the header the Brave Search API reads its key from.
const braveKeyHeader = "X-Subscription-Token"

// WebSearchSettings is [agents.web_search] (or [agent_defaults.web_search]):
// the provider of the agent's web_search tool.
type WebSearchSettings struct {
	Provider string `toml:"provider" berth:"check=webSearchProvider"`
	BaseURL  string `toml:"base_url" berth:"check=httpURL"`
	// Secret names the [[egress.secrets]] entry that carries the
	// provider's key (Brave's X-Subscription-Token).
	Secret string `toml:"secret" berth:"check=nonEmpty"`
}

// WebSearch is an agent's effective [agents.web_search].
type WebSearch struct {
	Provider string
	BaseURL  string // DefaultBraveBaseURL for brave when unset
	Secret   string
}

// Bounds of an MCP entry, as berth-agent takes them.
const (
	maxMCPNameLength = 32
	maxMCPTimeout    = Duration(time.Hour)
)

var mcpNamePattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]|_[A-Za-z0-9-])*$`)

// mcpToolPattern is a bare tool name that still fits the model APIs'
// 64 characters once it is mcp__<server>__<tool>.
var mcpToolPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func checkMCPName(s string) string {
	if len(s) > maxMCPNameLength || !mcpNamePattern.MatchString(s) {
		return fmt.Sprintf("%q is not an MCP server name: use 1 to %d letters, digits, '-' or single '_'", s, maxMCPNameLength)
	}
	return ""
}

// checkMCPURL refuses what berth-agent would refuse, and credentials in
// the URL: they belong in an egress secret, which the sandbox never holds.
func checkMCPURL(s string) string {
	if msg := httpURL(s); msg != "" {
		return msg
	}
	u, _ := url.Parse(s)
	if u.User != nil {
		return fmt.Sprintf("%q holds credentials: put them in an [[egress.secrets]] entry and name it in headers_secret", redactUserinfo(u))
	}
	if u.Fragment != "" {
		return fmt.Sprintf("%q has a fragment, which no request carries", s)
	}
	return ""
}

func redactUserinfo(u *url.URL) string {
	c := *u
	c.User = url.User("…")
	return c.String()
}

func checkMCPTool(s string) string {
	if !mcpToolPattern.MatchString(s) {
		return fmt.Sprintf("%q is not a tool name (1 to 64 letters, digits, '_' or '-')", s)
	}
	return ""
}

func checkMCPTimeout(d Duration) string {
	if d < Duration(time.Second) || d > maxMCPTimeout {
		return fmt.Sprintf("must be a length of time from 1s to %s, not %s", maxMCPTimeout, d)
	}
	return ""
}

// agentToolsMerged checks each agent's MCP servers and web search against
// the rest of the merged configuration: the secrets they name, and that
// the agent has an egress proxy to reach their hosts through. The URL the
// admin writes is the allow rule of berth-agent's own requests to it, never
// of a tool's (docs/adr/0026-agent-own-egress-channel.md).
func (t *tree) agentToolsMerged(into *checks) {
	// [agent_defaults]' entries are checked once per agent; an error that
	// is not the agent's own is reported once.
	var c checks
	defer func() {
		seen := map[string]bool{}
		for _, e := range c.errs {
			if s := e.Error(); !seen[s] {
				seen[s] = true
				into.errs = append(into.errs, e)
			}
		}
	}()
	secrets := map[string]*entry[EgressSecret]{}
	for _, e := range t.v.Egress.Secrets {
		secrets[e.v.Name] = e
	}
	d := t.v.AgentDefaults
	for _, a := range t.v.Agents {
		v := agentView{tree: t, agent: a, defaults: d, secrets: secrets}
		at, self, servers := d.at, d.self, d.v.MCP
		if _, ok := a.at["mcp"]; ok {
			at, self, servers = a.at, a.self, a.v.MCP
		}
		seen := map[string]loc{}
		for i := range servers {
			v.mcpServer(&c, at, self, i, &servers[i], seen)
		}
		at, self, ws := d.at, d.self, &d.v.WebSearch
		if webSearchSet(a.at) {
			at, self, ws = a.at, a.self, &a.v.WebSearch
		}
		if webSearchSet(at) {
			v.webSearch(&c, at, self, ws)
		}
	}
}

func webSearchSet(at fieldLocs) bool {
	for key := range at {
		if strings.HasPrefix(key, "web_search.") {
			return true
		}
	}
	return false
}

// agentView is one agent's settings with [agent_defaults] under them, for
// checks that need the effective value.
type agentView struct {
	tree     *tree
	agent    *entry[AgentSettings]
	defaults *entry[AgentSettings]
	secrets  map[string]*entry[EgressSecret]
}

func (v agentView) id() string { return v.agent.v.ID }

func (v agentView) boolSet(get func(*AgentSettings) *bool) bool {
	return firstSet(false, get(&v.agent.v), get(&v.defaults.v))
}

// directNetwork is why the agent's runs have no egress proxy, or "".
func (v agentView) directNetwork() string {
	switch {
	case first(v.agent.v.Backend, v.defaults.v.Backend) == BackendKubernetes:
		return "" // a pod's only way out is berth's egress router
	case v.boolSet(func(s *AgentSettings) *bool { return s.ContainerMode.Enabled }):
		if first(v.agent.v.ContainerMode.Network, v.defaults.v.ContainerMode.Network, defaultNetwork) != "none" {
			return "container_mode.network is not \"none\""
		}
		return ""
	case v.boolSet(func(s *AgentSettings) *bool { return s.FileAccess.Unrestricted }):
		return "file_access.unrestricted = true"
	case v.boolSet(func(s *AgentSettings) *bool { return s.FileAccess.AllowNetwork }):
		return "file_access.allow_network = true"
	}
	return ""
}

// throughProxy checks that the agent's runs reach u through the egress
// proxy: they have one. Its URL allows berth-agent's own requests there
// (runplan's agentToolRules); tools need an allow rule of their own.
func (v agentView) throughProxy(c *checks, l loc, what string, _ *url.URL, _ string) {
	if why := v.directNetwork(); why != "" {
		c.fail(l, "%s is reached only through the egress proxy, which agent %q's runs do not have (%s)", what, v.id(), why)
	}
}

func hostPort(u *url.URL) (string, int) {
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		port = 443
		if u.Scheme == "http" {
			port = 80
		}
	}
	return egresspolicy.NormalHost(u.Hostname()), port
}

func (v agentView) mcpServer(c *checks, at fieldLocs, self loc, i int, s *MCPServer, seen map[string]loc) {
	key := func(name string) string { return indexKey("mcp", i) + "." + name }
	elem := where(at, self, indexKey("mcp", i))
	if _, ok := at[key("name")]; !ok {
		c.fail(where(nil, elem, "name"), "is required: the server's tools are named mcp__<name>__<tool>")
	} else if first, dup := seen[s.Name]; dup {
		c.fail(at[key("name")], "MCP server %q is already defined on line %d", s.Name, first.line)
	} else {
		seen[s.Name] = at[key("name")]
	}
	_, hasCommand := at[key("command")]
	_, hasURL := at[key("url")]
	if hasCommand == hasURL {
		c.fail(elem, "set exactly one of command (a stdio server, started inside the sandbox) and url (streamable HTTP, through the egress proxy)")
		return
	}
	if hasCommand {
		if len(s.Command) == 0 {
			c.fail(at[key("command")], "name the program to run, and its arguments")
		}
		if l, ok := at[key("headers_secret")]; ok {
			c.fail(l, "is for a server reached by url: a stdio server's requests leave through the proxy like any tool's")
		}
		return
	}
	u, err := url.Parse(s.URL)
	if err != nil || checkMCPURL(s.URL) != "" {
		return // refused when it was read
	}
	what := fmt.Sprintf("MCP server %s", s.Name)
	v.throughProxy(c, at[key("url")], what, u, "POST")
	if l, ok := at[key("headers_secret")]; ok {
		v.secretFor(c, l, what, s.HeadersSecret, u, "POST")
	}
}

// secretFor checks that secret name exists and the proxy adds it to the
// requests of method to u: https (the proxy reads only the TLS it
// intercepts), its host, port, method and path among the secret's.
func (v agentView) secretFor(c *checks, l loc, what, name string, u *url.URL, method string) *EgressSecret {
	e, ok := v.secrets[name]
	if !ok {
		c.fail(l, "secret %q is not an [[egress.secrets]] entry (defined: %s)", name, strings.Join(v.secretNames(), ", "))
		return nil
	}
	s := &e.v
	host, port := hostPort(u)
	switch {
	case u.Scheme != "https":
		c.fail(l, "%s must be reached over https to get secret %q: the proxy adds a secret only inside TLS it intercepts", what, name)
	case !slices.ContainsFunc(s.Hosts, func(h string) bool { return egresspolicy.NormalHost(h) == host }):
		c.fail(l, "secret %q is not for host %s of %s: add it to the secret's hosts (%s)", name, host, what, strings.Join(s.Hosts, ", "))
	case len(s.Ports) > 0 && !slices.Contains(s.Ports, port):
		c.fail(l, "secret %q is not for port %d of %s: its ports are %v", name, port, what, s.Ports)
	case len(s.Methods) > 0 && !slices.ContainsFunc(s.Methods, func(m string) bool { return strings.EqualFold(m, method) }):
		c.fail(l, "secret %q is not added to %s requests, which %s sends: its methods are %v", name, method, what, s.Methods)
	case len(s.Paths) > 0 && !slices.ContainsFunc(s.Paths, func(p string) bool { return underPath(pathOf(u), p) }):
		c.fail(l, "secret %q is not added under path %s of %s: its paths are %v", name, pathOf(u), what, s.Paths)
	}
	return s
}

func pathOf(u *url.URL) string {
	if u.Path == "" {
		return "/"
	}
	return u.Path
}

// underPath says whether p is prefix or under it at a segment boundary, as
// the proxy matches a secret's paths.
func underPath(p, prefix string) bool {
	prefix = strings.TrimSuffix(prefix, "/")
	return prefix == "" || p == prefix || strings.HasPrefix(p, prefix+"/")
}

func (v agentView) secretNames() []string {
	names := make([]string, 0, len(v.secrets))
	for _, e := range v.tree.v.Egress.Secrets {
		names = append(names, e.v.Name)
	}
	if len(names) == 0 {
		return []string{"none"}
	}
	return names
}

func (v agentView) webSearch(c *checks, at fieldLocs, self loc, ws *WebSearchSettings) {
	if _, ok := at["web_search.provider"]; !ok {
		c.fail(where(at, self, "web_search.provider"), "is required: %s or %s", WebSearchSearXNG, WebSearchBrave)
		return
	}
	base := ws.BaseURL
	if base == "" {
		if ws.Provider != WebSearchBrave {
			c.fail(where(at, self, "web_search.base_url"), "is required for provider %s: the instance's URL", ws.Provider)
			return
		}
		base = DefaultBraveBaseURL
	}
	u, err := url.Parse(base)
	if err != nil || httpURL(base) != "" {
		return // refused when it was read
	}
	what := "web_search (" + ws.Provider + ")"
	v.throughProxy(c, where(at, self, "web_search.base_url"), what, u, "GET")
	l, hasSecret := at["web_search.secret"]
	if !hasSecret {
		if ws.Provider == WebSearchBrave {
			c.fail(where(at, self, "web_search.secret"), "is required for provider brave: name an [[egress.secrets]] entry for %s with header = %q and format = \"{}\", which the proxy adds", u.Hostname(), braveKeyHeader)
		}
		return
	}
	// The secret must cover the path the tool asks, under base_url.
	search := *u
	search.Path = strings.TrimSuffix(u.Path, "/") + webSearchPaths[ws.Provider]
	s := v.secretFor(c, l, what, ws.Secret, &search, "GET")
	if s != nil && ws.Provider == WebSearchBrave && (!strings.EqualFold(s.Header, braveKeyHeader) || s.Format != "{}") {
		c.fail(l, "secret %q must have header = %q and format = \"{}\": the Brave Search API reads its key from that header, as it is", ws.Secret, braveKeyHeader)
	}
}

// webSearch resolves an agent's [agents.web_search]: the agent's table when
// it sets one, else [agent_defaults]'s; nil when neither does.
func webSearchOf(s, d *WebSearchSettings) *WebSearch {
	ws := s
	if ws.Provider == "" {
		ws = d
	}
	if ws.Provider == "" {
		return nil
	}
	out := &WebSearch{Provider: ws.Provider, BaseURL: ws.BaseURL, Secret: ws.Secret}
	if out.BaseURL == "" && out.Provider == WebSearchBrave {
		out.BaseURL = DefaultBraveBaseURL
	}
	return out
}

// mcpOf resolves an agent's MCP servers: the agent's list when it sets one
// (even empty), else [agent_defaults]'s.
func mcpOf(s, d []MCPServer) []MCPServer {
	list := s
	if list == nil {
		list = d
	}
	out := make([]MCPServer, 0, len(list))
	for _, m := range list {
		m.Command, m.Tools = slices.Clone(m.Command), slices.Clone(m.Tools)
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
