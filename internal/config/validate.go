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

func (c *checks) str(at fieldLocs, name, value string, check func(string) string) {
	if l, ok := at[name]; ok {
		if msg := check(value); msg != "" {
			c.fail(l, "%s", msg)
		}
	}
}

func (c *checks) strs(at fieldLocs, name string, values []string, check func(string) string) {
	if l, ok := at[name]; ok {
		for i, v := range values {
			if msg := check(v); msg != "" {
				c.fail(l.elem(i), "%s", msg)
			}
		}
	}
}

// egressSecret checks one [[egress.secrets]] entry.
func (c *checks) egressSecret(e *secretEntry, seen map[string]loc) {
	s := &e.s
	if _, ok := e.at["name"]; !ok {
		c.fail(where(e.at, e.self, "name"), "is required")
	} else if first, dup := seen[s.Name]; dup {
		c.fail(e.at["name"], "secret %q is already defined on line %d", s.Name, first.line)
	} else {
		seen[s.Name] = e.at["name"]
	}
	c.str(e.at, "name", s.Name, nonEmpty)
	_, hasEnv := e.at["env"]
	_, hasFile := e.at["file"]
	if hasEnv == hasFile {
		c.fail(e.self, "set exactly one of env and file (where the secret's value is read)")
	}
	c.str(e.at, "env", s.Env, nonEmpty)
	c.str(e.at, "file", s.File, nonEmpty)
	if _, ok := e.at["hosts"]; !ok || len(s.Hosts) == 0 {
		c.fail(where(e.at, e.self, "hosts"), "name at least one host the secret is for")
	}
	c.strs(e.at, "hosts", s.Hosts, func(h string) string {
		if _, err := egresspolicy.ParseHost(h); err != nil {
			return err.Error()
		}
		return ""
	})
	if l, ok := e.at["ports"]; ok {
		if len(s.Ports) == 0 {
			c.fail(l, "name at least one port, or leave ports out (any port)")
		}
		for i, p := range s.Ports {
			if p < 1 || p > 65535 {
				c.fail(l.elem(i), "port %d is not 1-65535", p)
			}
		}
	}
	if l, ok := e.at["methods"]; ok && len(s.Methods) == 0 {
		c.fail(l, "name at least one method, or leave methods out (any method)")
	}
	c.strs(e.at, "methods", s.Methods, func(m string) string {
		if m = strings.ToUpper(m); m == "CONNECT" || !slices.Contains(egresspolicy.HTTPMethods, m) {
			return fmt.Sprintf("%q is not the method of a request inside a tunnel (GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS)", m)
		}
		return ""
	})
	if l, ok := e.at["paths"]; ok && len(s.Paths) == 0 {
		c.fail(l, "name at least one path prefix, or leave paths out (any path)")
	}
	c.strs(e.at, "paths", s.Paths, func(p string) string {
		if err := egresspolicy.CheckSecretPath(p); err != nil {
			return err.Error()
		}
		return ""
	})
	c.str(e.at, "header", s.Header, func(h string) string {
		if h == "" || strings.ContainsAny(h, " :\r\n") {
			return fmt.Sprintf("%q is not a header name", h)
		}
		return ""
	})
	c.str(e.at, "format", s.Format, func(f string) string {
		if strings.Count(f, "{}") != 1 || strings.ContainsAny(f, "\r\n") {
			return fmt.Sprintf("%q must hold \"{}\" once, where the value goes", f)
		}
		return ""
	})
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

// validateValues checks the values one file sets, on their own.
func (t *tree) validateValues() Errors {
	var c checks
	c.str(t.at, "providers.primary", t.primary, nonEmpty)
	c.strs(t.at, "providers.fallback", t.fallback, nonEmpty)
	for _, name := range t.providerNames {
		e := t.providers[name]
		c.str(e.at, "kind", e.p.Kind, oneOf(providerKinds...))
		c.str(e.at, "api_key_env", e.p.APIKeyEnv, func(s string) string {
			if !envNamePattern.MatchString(s) {
				return fmt.Sprintf("%q is not an environment variable name", s)
			}
			return ""
		})
		c.str(e.at, "base_url", e.p.BaseURL, httpURL)
		if l, ok := e.at["max_tokens"]; ok && e.p.MaxTokens < 1 {
			c.fail(l, "must be at least 1, not %d", e.p.MaxTokens)
		}
		if l, ok := e.at["endpoints"]; ok && len(e.p.Endpoints) == 0 {
			c.fail(l, "name at least one endpoint, or leave endpoints out (the kind's own)")
		}
		c.strs(e.at, "endpoints", e.p.Endpoints, func(s string) string {
			if err := egresspolicy.CheckEndpoint(s); err != nil {
				return err.Error()
			}
			return ""
		})
		c.str(e.at, "api_version", e.p.APIVersion, func(s string) string {
			if !apiVersionPattern.MatchString(s) {
				return fmt.Sprintf("%q is not an anthropic-version date (YYYY-MM-DD)", s)
			}
			return ""
		})
		for _, f := range []struct{ key, value string }{{"organization", e.p.Organization}, {"project", e.p.Project}} {
			c.str(e.at, f.key, f.value, func(s string) string {
				if !scopeIDPattern.MatchString(s) {
					return fmt.Sprintf("%q is not an OpenAI %s id (letters, digits, '-' and '_')", s, f.key)
				}
				return ""
			})
		}
	}

	c.agentValues(&t.defaults)
	c.imageValues(t.at, &t.image)
	seen := map[string]loc{}
	for _, a := range t.agents {
		c.agentValues(a)
		c.imageValues(a.at, &a.s.ImageConfig)
		if _, ok := a.at["id"]; !ok {
			c.fail(where(a.at, a.self, "id"), "is required")
			continue
		}
		c.str(a.at, "id", a.s.ID, validID)
		if first, dup := seen[a.s.ID]; dup {
			c.fail(a.at["id"], "agent %q is already defined on line %d", a.s.ID, first.line)
		}
		seen[a.s.ID] = a.at["id"]
	}

	c.str(t.at, "intake.listen", t.intake.Listen, func(s string) string {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return fmt.Sprintf("%q is not a host:port address", s)
		}
		return ""
	})

	seen = map[string]loc{}
	for _, e := range t.connectors {
		if _, ok := e.at["id"]; !ok {
			c.fail(where(e.at, e.self, "id"), "is required")
		} else {
			c.str(e.at, "id", e.c.ID, validID)
			if first, dup := seen[e.c.ID]; dup {
				c.fail(e.at["id"], "connector %q is already defined on line %d", e.c.ID, first.line)
			}
			seen[e.c.ID] = e.at["id"]
		}
		c.connectorValues(e)
	}

	seenSecret := map[string]loc{}
	for _, e := range t.secrets {
		c.egressSecret(e, seenSecret)
	}

	for _, b := range t.bindings {
		c.str(b.at, "server_id", b.b.ServerID, nonEmpty)
		c.str(b.at, "channel_id", b.b.ChannelID, nonEmpty)
		c.str(b.at, "channel_name", b.b.ChannelName, func(s string) string {
			if _, err := path.Match(s, ""); err != nil {
				return fmt.Sprintf("%q is not a valid glob pattern", s)
			}
			return ""
		})
	}

	if l, ok := t.at["scheduler.max_concurrent_runs"]; ok && t.maxConcurrentRuns < 1 {
		c.fail(l, "must be at least 1, not %d", t.maxConcurrentRuns)
	}
	if l, ok := t.at["scheduler.default_timeout_seconds"]; ok {
		c.timeout(l, t.defaultTimeoutSeconds)
	}
	c.str(t.at, "scheduler.run_as", t.runAs, func(s string) string {
		switch s {
		case "":
			return "must not be empty"
		case "root", "0":
			return "agents must not run as root"
		}
		return ""
	})
	c.str(t.at, "scheduler.agent_binary", t.agentBinary, absolutePath)
	c.str(t.at, "scheduler.agent_uids", t.agentUIDs, func(v string) string {
		if _, err := ParseUIDRange(v); err != nil {
			return err.Error()
		}
		return ""
	})
	c.str(t.at, "scheduler.egress_binary", t.egressBinary, absolutePath)
	c.str(t.at, "scheduler.egress_user", t.egressUser, func(v string) string {
		if v == "root" || v == "0" {
			return "must not be root: the egress proxy parses what sandboxes send"
		}
		return nonEmpty(v)
	})

	c.within(t.at, "retention.finished_runs_days", t.finishedRunsDays, 1, maxRetentionDays, "")
	c.within(t.at, "retention.runs_per_agent", t.runsPerAgent, 1, maxRunsPerAgent, "")
	c.within(t.at, "retention.delivered_hours", t.deliveredHours, minDeliveredHours, maxRetentionDays*24,
		": a platform may redeliver an event for a day, and a message id forgotten sooner would run it twice")
	c.within(t.at, "retention.idle_conversation_days", t.idleConversationDays, 1, maxRetentionDays, "")
	return c.errs
}

// Upper bounds of [retention], far from overflowing time.Duration.
const (
	maxRetentionDays = 100 * 365
	maxRunsPerAgent  = 1 << 30
)

// within checks that an integer key, when set, is between lo and hi; why
// explains the lower bound.
func (c *checks) within(at fieldLocs, name string, v, lo, hi int, why string) {
	l, ok := at[name]
	switch {
	case !ok:
	case v < lo:
		c.fail(l, "must be at least %d, not %d%s", lo, v, why)
	case v > hi:
		c.fail(l, "must be at most %d, not %d", hi, v)
	}
}

// maxTimeoutSeconds keeps timeouts far from overflowing time.Duration.
const maxTimeoutSeconds = 1 << 31

func (c *checks) timeout(l loc, seconds int) {
	if seconds < 1 || seconds > maxTimeoutSeconds {
		c.fail(l, "must be a number of seconds greater than 0, not %d", seconds)
	}
}

func (c *checks) agentValues(a *agentEntry) {
	s := &a.s
	c.str(a.at, "workspace", s.Workspace, absolutePath)
	if l, ok := a.at["max_iterations"]; ok && (*s.MaxIterations < 1 || *s.MaxIterations > 1000) {
		c.fail(l, "must be between 1 and 1000, not %d", *s.MaxIterations)
	}
	c.strs(a.at, "tools.allow", s.Tools.Allow, nonEmpty)
	c.strs(a.at, "tools.deny", s.Tools.Deny, nonEmpty)
	if l, ok := a.at["container_mode.timeout_seconds"]; ok {
		c.timeout(l, *s.ContainerMode.TimeoutSeconds)
	}
	c.str(a.at, "container_mode.network", s.ContainerMode.Network, CheckNetwork)
	c.containerValues(a)
	c.strs(a.at, "egress.allow", s.Egress.Allow, func(v string) string {
		if _, err := egresspolicy.ParseRule(v); err != nil {
			return err.Error()
		}
		return ""
	})
	c.strs(a.at, "file_access.allow_read", s.FileAccess.AllowRead, absolutePath)
	c.strs(a.at, "file_access.allow_read_write", s.FileAccess.AllowReadWrite, absolutePath)
	c.strs(a.at, "file_access.deny", s.FileAccess.Deny, absolutePath)
}

// validateMerged checks what only the merged configuration can tell:
// references between tables and fields that several files contribute to.
func (t *tree) validateMerged() Errors {
	var c checks
	providerExists := func(name string) bool {
		_, ok := t.providers[name]
		return ok || name == localProvider
	}
	checkProvider := func(at fieldLocs, self loc, name, value string) {
		if _, ok := at[name]; ok && value != "" && !providerExists(value) {
			c.fail(where(at, self, name), "provider %q is not defined (defined: %s)", value, strings.Join(t.knownProviders(), ", "))
		}
	}
	checkProvider(t.at, loc{}, "providers.primary", t.primary)
	if l, ok := t.at["providers.fallback"]; ok {
		for i, name := range t.fallback {
			if name != "" && !providerExists(name) {
				c.fail(l.elem(i), "provider %q is not defined (defined: %s)", name, strings.Join(t.knownProviders(), ", "))
			}
		}
	}
	for _, name := range t.providerNames {
		e := t.providers[name]
		kind := e.p.Kind
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
		if kind != "local" && e.p.APIKeyEnv == "" && e.p.BaseURL == "" {
			c.fail(where(e.at, e.self, "api_key_env"), "is required for a %s provider without base_url", kind)
		}
	}

	agentExists := func(id string) bool {
		for _, a := range t.agents {
			if a.s.ID == id {
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
	checkProvider(t.defaults.at, t.defaults.self, "provider", t.defaults.s.Provider)
	t.imageMerged(&c, t.at, &t.image)
	for _, a := range t.agents {
		checkProvider(a.at, a.self, "provider", a.s.Provider)
		t.imageMerged(&c, a.at, &a.s.ImageConfig)
	}

	connectorExists := func(id string) bool {
		for _, e := range t.connectors {
			if e.c.ID == id {
				return true
			}
		}
		return false
	}
	for _, e := range t.connectors {
		c.connectorMerged(e)
		checkAgent(e.at, e.self, "default_agent", e.c.DefaultAgent)
	}

	for _, b := range t.bindings {
		if _, ok := b.at["agent"]; !ok {
			c.fail(where(b.at, b.self, "agent"), "is required")
		} else {
			checkAgent(b.at, b.self, "agent", b.b.Agent)
		}
		if l, ok := b.at["connector"]; ok && !connectorExists(b.b.Connector) {
			c.fail(l, "connector %q is not defined", b.b.Connector)
		}
		_, hasID := b.at["channel_id"]
		_, hasName := b.at["channel_name"]
		_, hasServer := b.at["server_id"]
		if !hasID && !hasName && !hasServer {
			c.fail(b.self, "a binding needs channel_id, channel_name or server_id")
		}
	}
	checkAgent(t.at, loc{}, "intake.default_agent", t.intake.DefaultAgent)
	return c.errs
}

func (t *tree) knownProviders() []string {
	names := []string{localProvider}
	for _, n := range t.providerNames {
		if n != localProvider {
			names = append(names, n)
		}
	}
	return names
}

func (t *tree) agentIDs() []string {
	ids := make([]string, 0, len(t.agents))
	for _, a := range t.agents {
		ids = append(ids, a.s.ID)
	}
	if len(ids) == 0 {
		return []string{"none"}
	}
	return ids
}
