package config

import (
	"fmt"
	"net"
	"net/url"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
)

// idPattern is what agent and connector ids must match: they become path
// components and D-Bus object path elements.
var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

var envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

var (
	apiVersionPattern = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}$`)
	scopeIDPattern    = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
)

var providerKinds = []string{"local", "openai", "anthropic"}

// minMemoryLimit is the smallest limit Docker accepts.
const minMemoryLimit = 6 << 20

// checks collects errors found in a tree.
type checks struct{ errs Errors }

func (c *checks) fail(l loc, format string, args ...any) {
	c.errs = append(c.errs, &Error{File: l.file, Line: l.line, Key: l.key, Msg: fmt.Sprintf(format, args...)})
}

// where is the location of a field: where it was set, else the table it
// belongs in.
func where(at fieldLocs, self loc, name string) loc {
	if l, ok := at[name]; ok {
		return l
	}
	l := self
	for part := range strings.SplitSeq(name, ".") {
		l.key = joinKey(l.key, part)
	}
	return l
}

// egressSecret checks what one [[egress.secrets]] entry needs beyond its
// values: a unique name, one source and at least one host.
func (c *checks) egressSecret(e *entry[EgressSecret], seen map[string]loc) {
	s := &e.v
	if _, ok := e.at["name"]; !ok {
		c.fail(where(e.at, e.self, "name"), "is required")
	} else if first, dup := seen[s.Name]; dup {
		c.fail(e.at["name"], "secret %q is already defined on line %d", s.Name, first.line)
	} else {
		seen[s.Name] = e.at["name"]
	}
	_, hasEnv := e.at["env"]
	_, hasFile := e.at["file"]
	if hasEnv == hasFile {
		c.fail(e.self, "set exactly one of env and file (where the secret's value is read)")
	}
	if _, ok := e.at["hosts"]; !ok || len(s.Hosts) == 0 {
		c.fail(where(e.at, e.self, "hosts"), "name at least one host the secret is for")
	}
	c.notEmptyList(e.at, "ports", len(s.Ports), "name at least one port, or leave ports out (any port)")
	c.notEmptyList(e.at, "methods", len(s.Methods), "name at least one method, or leave methods out (any method)")
	c.notEmptyList(e.at, "paths", len(s.Paths), "name at least one path prefix, or leave paths out (any path)")
}

// notEmptyList refuses a list key that is set to [].
func (c *checks) notEmptyList(at fieldLocs, name string, n int, msg string) {
	if l, ok := at[name]; ok && n == 0 {
		c.fail(l, "%s", msg)
	}
}

func nonEmpty(s string) string {
	if s == "" {
		return "must not be empty"
	}
	return ""
}

func validID(s string) string {
	if !idPattern.MatchString(s) {
		return fmt.Sprintf("%q is not a valid id: use 1 to 63 lowercase letters, digits, '-' or '_', starting with a letter or digit", s)
	}
	return ""
}

func oneOf(allowed ...string) func(string) string {
	return func(s string) string {
		for _, a := range allowed {
			if s == a {
				return ""
			}
		}
		return fmt.Sprintf("%q is not one of %s", s, strings.Join(allowed, ", "))
	}
}

func absolutePath(s string) string {
	if !filepath.IsAbs(s) {
		return fmt.Sprintf("%q is not an absolute path", s)
	}
	return ""
}

func httpURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Sprintf("%q is not an absolute http(s) URL", s)
	}
	return ""
}

// valueChecks are the checks a field's tag names (berth:"check=NAME"),
// each run on a value (each element of a list) as it is read: a
// func(string) string, func(int) string or func(Duration) string returns
// what is wrong, or ""; a sizeRule reads a size.
var valueChecks = map[string]any{
	"nonEmpty":     nonEmpty,
	"id":           validID,
	"absolutePath": absolutePath,
	"httpURL":      httpURL,
	"atLeastOne":   atLeast(1),
	"sandboxScope": oneOf(SandboxScopeMessage, SandboxScopeConversation),
	"sandboxDuration": func(d Duration) string {
		if d < Duration(time.Second) || d > maxSandboxDuration {
			return fmt.Sprintf("must be a length of time from 1s to %s, not %s", maxSandboxDuration, d)
		}
		return ""
	},
	"seconds": func(n int) string {
		if n < 1 || n > maxTimeoutSeconds {
			return fmt.Sprintf("must be a number of seconds greater than 0, not %d", n)
		}
		return ""
	},
	"glob": func(s string) string {
		if _, err := path.Match(s, ""); err != nil {
			return fmt.Sprintf("%q is not a valid glob pattern", s)
		}
		return ""
	},
	"hostPort": func(s string) string {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return fmt.Sprintf("%q is not a host:port address", s)
		}
		return ""
	},
	"envName": func(s string) string {
		if !envNamePattern.MatchString(s) {
			return fmt.Sprintf("%q is not an environment variable name", s)
		}
		return ""
	},

	// [providers.NAME]
	"providerKind": oneOf(providerKinds...),
	"endpoint":     errorText(egresspolicy.CheckEndpoint),
	"apiVersion": func(s string) string {
		if !apiVersionPattern.MatchString(s) {
			return fmt.Sprintf("%q is not an anthropic-version date (YYYY-MM-DD)", s)
		}
		return ""
	},
	"openaiOrganization": openAIScopeID("organization"),
	"openaiProject":      openAIScopeID("project"),

	// agents
	"maxIterations":  between(1, 1000),
	"memoryLimit":    memoryLimitRule,
	"workspaceQuota": workspaceQuotaRule,
	"attachmentSize": attachmentSizeRule,
	"replyFileSize":  replyFileSizeRule,
	"runtime":        CheckRuntime,
	"warm":           between(0, MaxWarm),
	"bind":           checkBind,
	"securityOpt":    checkSecurityOpt,
	"egressRule": errorText(func(s string) error {
		_, err := egresspolicy.ParseRule(s)
		return err
	}),
	"toolAsk": errorText(checkToolAsk),
	"approvalTimeout": func(d Duration) string {
		if d < minApprovalTimeout || d > maxApprovalTimeout {
			return fmt.Sprintf("must be a length of time from %s to %s, not %s", minApprovalTimeout, maxApprovalTimeout, d)
		}
		return ""
	},
	"imageRef":      imageRef,
	"debianPackage": debianPackage,
	// [[agents.mcp]], [agents.web_search] (mcp.go)
	"mcpName":           checkMCPName,
	"mcpURL":            checkMCPURL,
	"mcpTool":           checkMCPTool,
	"mcpTimeout":        checkMCPTimeout,
	"webSearchProvider": oneOf(WebSearchSearXNG, WebSearchBrave),

	// [[connectors]]
	"connectorType":    oneOf(ConnectorTypes...),
	"gatewayURL":       gatewayURL,
	"caFile":           caFile,
	"credential":       checkCredentialRef,
	"ed25519PublicKey": ed25519PublicKey,
	"snowflake":        snowflake,
	"trigger":          oneOf(TriggerMention, TriggerAll),
	"slackMode":        oneOf(SlackSocket, SlackEvents),
	"progress":         oneOf(ProgressEdit, ProgressTyping, ProgressOff),

	// [[egress.secrets]]
	"host": errorText(func(h string) error {
		_, err := egresspolicy.ParseHost(h)
		return err
	}),
	"port": func(p int) string {
		if p < 1 || p > 65535 {
			return fmt.Sprintf("port %d is not 1-65535", p)
		}
		return ""
	},
	"tunnelMethod": func(m string) string {
		if m = strings.ToUpper(m); m == "CONNECT" || !slices.Contains(egresspolicy.HTTPMethods, m) {
			return fmt.Sprintf("%q is not the method of a request inside a tunnel (GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS)", m)
		}
		return ""
	},
	"secretPath": errorText(egresspolicy.CheckSecretPath),
	"headerName": func(h string) string {
		if h == "" || strings.ContainsAny(h, " :\r\n") {
			return fmt.Sprintf("%q is not a header name", h)
		}
		return ""
	},
	"secretFormat": func(f string) string {
		if strings.Count(f, "{}") != 1 || strings.ContainsAny(f, "\r\n") {
			return fmt.Sprintf("%q must hold \"{}\" once, where the value goes", f)
		}
		return ""
	},

	// [scheduler]
	"runAs": func(s string) string {
		switch s {
		case "":
			return "must not be empty"
		case "root", "0":
			return "agents must not run as root"
		}
		return ""
	},
	"cpuWeight": func(n int) string {
		if n < 1 || n > MaxRunsCPUWeight {
			return fmt.Sprintf("must be a CPU weight from 1 to %d (100 is an ordinary service's), not %d", MaxRunsCPUWeight, n)
		}
		return ""
	},
	"egressUser": func(v string) string {
		if v == "root" || v == "0" {
			return "must not be root: the egress proxy parses what sandboxes send"
		}
		return nonEmpty(v)
	},

	// [retention]
	"retentionDays": within(1, maxRetentionDays, ""),
	"runsPerAgent":  within(1, maxRunsPerAgent, ""),
	"deliveredHours": within(minDeliveredHours, maxRetentionDays*24,
		": a platform may redeliver an event for a day, and a message id forgotten sooner would run it twice"),
}

// errorText turns a check that returns an error into one that returns its
// text.
// checkToolAsk checks an [agents.tools] ask entry, and that it names a
// tool berth-agent has: a misspelt name would ask before nothing.
func checkToolAsk(s string) error {
	tool, _, _ := strings.Cut(s, ":")
	tool = strings.TrimSpace(tool)
	if tool != "" && !slices.Contains(agentproto.BuiltinTools, tool) && !strings.HasPrefix(tool, "mcp__") {
		return fmt.Errorf("%q: berth-agent has no tool %q (its tools: %s, and an MCP server's mcp__<server>__<tool>)", s, tool, strings.Join(agentproto.BuiltinTools, ", "))
	}
	if _, err := egresspolicy.ParseToolRule(s); err != nil {
		return fmt.Errorf("%q: %w", s, err)
	}
	return nil
}

func errorText(check func(string) error) func(string) string {
	return func(s string) string {
		if err := check(s); err != nil {
			return err.Error()
		}
		return ""
	}
}

func atLeast(lo int) func(int) string {
	return func(n int) string {
		if n < lo {
			return fmt.Sprintf("must be at least %d, not %d", lo, n)
		}
		return ""
	}
}

func between(lo, hi int) func(int) string {
	return func(n int) string {
		if n < lo || n > hi {
			return fmt.Sprintf("must be between %d and %d, not %d", lo, hi, n)
		}
		return ""
	}
}

// within checks that an integer is between lo and hi; why explains the
// lower bound.
func within(lo, hi int, why string) func(int) string {
	return func(n int) string {
		switch {
		case n < lo:
			return fmt.Sprintf("must be at least %d, not %d%s", lo, n, why)
		case n > hi:
			return fmt.Sprintf("must be at most %d, not %d", hi, n)
		}
		return ""
	}
}

func openAIScopeID(key string) func(string) string {
	return func(s string) string {
		if !scopeIDPattern.MatchString(s) {
			return fmt.Sprintf("%q is not an OpenAI %s id (letters, digits, '-' and '_')", s, key)
		}
		return ""
	}
}

// Upper bounds of [retention], far from overflowing time.Duration.
const (
	maxRetentionDays = 100 * 365
	maxRunsPerAgent  = 1 << 30
)

// maxSandboxDuration bounds idle_stop and max_lifetime: a year is far from
// overflowing time.Duration and longer than any conversation.
const maxSandboxDuration = Duration(365 * 24 * time.Hour)

// approval_timeout's bounds: long enough for a person to see the question,
// short enough that a run is not held past a day.
const (
	minApprovalTimeout = Duration(10 * time.Second)
	maxApprovalTimeout = Duration(24 * time.Hour)
)

// maxTimeoutSeconds keeps timeouts far from overflowing time.Duration.
const maxTimeoutSeconds = 1 << 31

// validateValues checks what one file asks beyond each value on its own
// (the tags' checks ran while it was decoded): required keys, unique ids,
// lists that must not be empty.
func (t *tree) validateValues() Errors {
	var c checks
	for _, e := range t.v.Providers.Entries {
		c.notEmptyList(e.at, "endpoints", len(e.v.Endpoints), "name at least one endpoint, or leave endpoints out (the kind's own)")
	}

	c.imageValues(t.at, &t.v.ImageConfig)
	seen := map[string]loc{}
	for _, a := range t.v.Agents {
		c.imageValues(a.at, &a.v.ImageConfig)
		if _, ok := a.at["id"]; !ok {
			c.fail(where(a.at, a.self, "id"), "is required")
			continue
		}
		if first, dup := seen[a.v.ID]; dup {
			c.fail(a.at["id"], "agent %q is already defined on line %d", a.v.ID, first.line)
		}
		seen[a.v.ID] = a.at["id"]
	}

	seen = map[string]loc{}
	for _, e := range t.v.Connectors {
		if _, ok := e.at["id"]; !ok {
			c.fail(where(e.at, e.self, "id"), "is required")
			continue
		}
		if first, dup := seen[e.v.ID]; dup {
			c.fail(e.at["id"], "connector %q is already defined on line %d", e.v.ID, first.line)
		}
		seen[e.v.ID] = e.at["id"]
	}

	seenSecret := map[string]loc{}
	for _, e := range t.v.Egress.Secrets {
		c.egressSecret(e, seenSecret)
	}
	c.schedulesValues(t.v.Schedules)
	return c.errs
}

// validateMerged checks what only the merged configuration can tell:
// references between tables and fields that several files contribute to.
func (t *tree) validateMerged() Errors {
	var c checks
	providerExists := func(name string) bool {
		_, ok := t.provider(name)
		return ok || name == localProvider
	}
	checkProvider := func(at fieldLocs, self loc, name, value string) {
		if _, ok := at[name]; ok && value != "" && !providerExists(value) {
			c.fail(where(at, self, name), "provider %q is not defined (defined: %s)", value, strings.Join(t.knownProviders(), ", "))
		}
	}
	checkProvider(t.at, loc{}, "providers.primary", t.v.Providers.Primary)
	if l, ok := t.at["providers.fallback"]; ok {
		for i, name := range t.v.Providers.Fallback {
			if name != "" && !providerExists(name) {
				c.fail(l.elem(i), "provider %q is not defined (defined: %s)", name, strings.Join(t.knownProviders(), ", "))
			}
		}
	}
	for _, e := range t.v.Providers.Entries {
		name := e.v.Name
		kind := e.v.Kind
		if _, set := e.at["kind"]; !set {
			if oneOf(providerKinds...)(name) != "" {
				c.fail(where(e.at, e.self, "kind"), "is required: one of %s", strings.Join(providerKinds, ", "))
				continue
			}
			kind = name
		}
		if _, set := e.at["api_version"]; set && kind != "anthropic" {
			c.fail(e.at["api_version"], "is for an anthropic provider, not %s", kind)
		}
		for _, key := range []string{"organization", "project"} {
			if _, set := e.at[key]; set && kind != "openai" {
				c.fail(e.at[key], "is for an openai provider, not %s", kind)
			}
		}
		if _, set := e.at["endpoints"]; set && kind == "local" {
			c.fail(e.at["endpoints"], "is for a provider reached through the egress proxy, not a local one")
		}
		if kind != "local" && e.v.APIKeyEnv == "" && e.v.BaseURL == "" {
			c.fail(where(e.at, e.self, "api_key_env"), "is required for a %s provider without base_url", kind)
		}
	}

	agentExists := func(id string) bool {
		for _, a := range t.v.Agents {
			if a.v.ID == id {
				return true
			}
		}
		return false
	}
	checkAgent := func(at fieldLocs, self loc, name, id string) {
		if _, ok := at[name]; ok && !agentExists(id) {
			c.fail(where(at, self, name), "agent %q is not defined (defined: %s)", id, strings.Join(t.agentIDs(), ", "))
		}
	}
	d := t.v.AgentDefaults
	checkProvider(d.at, d.self, "provider", d.v.Provider)
	t.imageMerged(&c, t.at, &t.v.ImageConfig)
	for _, a := range t.v.Agents {
		checkProvider(a.at, a.self, "provider", a.v.Provider)
		t.imageMerged(&c, a.at, &a.v.ImageConfig)
	}

	connectorExists := func(id string) bool {
		for _, e := range t.v.Connectors {
			if e.v.ID == id {
				return true
			}
		}
		return false
	}
	for _, e := range t.v.Connectors {
		c.connectorMerged(e)
		checkAgent(e.at, e.self, "default_agent", e.v.DefaultAgent)
	}

	for _, b := range t.v.Bindings {
		if _, ok := b.at["agent"]; !ok {
			c.fail(where(b.at, b.self, "agent"), "is required")
		} else {
			checkAgent(b.at, b.self, "agent", b.v.Agent)
		}
		if l, ok := b.at["connector"]; ok && !connectorExists(b.v.Connector) {
			c.fail(l, "connector %q is not defined", b.v.Connector)
		}
		_, hasID := b.at["channel_id"]
		_, hasName := b.at["channel_name"]
		_, hasServer := b.at["server_id"]
		if !hasID && !hasName && !hasServer {
			c.fail(b.self, "a binding needs channel_id, channel_name or server_id")
		}
	}
	checkAgent(t.at, loc{}, "intake.default_agent", t.v.Intake.DefaultAgent)
	t.agentToolsMerged(&c)
	t.gitMerged(&c)
	t.schedulesMerged(&c)
	t.approversMerged(&c)
	t.kubernetesMerged(&c)
	return c.errs
}

func (t *tree) knownProviders() []string {
	names := []string{localProvider}
	for _, e := range t.v.Providers.Entries {
		if e.v.Name != localProvider {
			names = append(names, e.v.Name)
		}
	}
	return names
}

func (t *tree) agentIDs() []string {
	ids := make([]string, 0, len(t.v.Agents))
	for _, a := range t.v.Agents {
		ids = append(ids, a.v.ID)
	}
	if len(ids) == 0 {
		return []string{"none"}
	}
	return ids
}
