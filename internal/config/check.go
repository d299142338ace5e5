package config

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// WriteCheck loads the configuration at path and writes what `berthctl
// config check` shows: a one-line summary, and with agentID that agent's
// effective settings. Secrets are never written: providers show the name of
// their key's environment variable, connector secrets show as "(set)". On
// failure it writes every error, one per line, and returns a non-nil error.
func WriteCheck(w io.Writer, path, agentID string) error {
	c, err := Load(path)
	if err != nil {
		var errs Errors
		if !errors.As(err, &errs) {
			errs = Errors{{File: path, Msg: err.Error(), err: err}}
		}
		for _, e := range errs {
			fmt.Fprintln(w, e)
		}
		return fmt.Errorf("configuration is invalid: %s", plural(len(errs), "error"))
	}
	fmt.Fprintf(w, "configuration ok: %s (%s), %s%s, %s%s\n",
		plural(len(c.Sources), "file"), strings.Join(c.Sources, ", "),
		plural(len(c.Agents), "agent"), listed(c.AgentIDs()),
		plural(len(c.Connectors), "connector"), listed(c.connectorIDs()))
	if agentID == "" {
		c.writeSummary(w)
		return nil
	}
	a, err := c.Agent(agentID)
	if err != nil {
		fmt.Fprintln(w, err)
		return err
	}
	c.writeAgent(w, a)
	return nil
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

func listed(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	return " (" + strings.Join(ids, ", ") + ")"
}

func (c *Config) connectorIDs() []string {
	ids := make([]string, 0, len(c.Connectors))
	for _, k := range c.Connectors {
		ids = append(ids, k.ID)
	}
	return ids
}

// tomlWriter writes key = value lines in TOML syntax.
type tomlWriter struct{ w io.Writer }

func (t tomlWriter) table(name string) { fmt.Fprintf(t.w, "\n[%s]\n", name) }

func (t tomlWriter) str(key, v string) {
	if v != "" {
		fmt.Fprintf(t.w, "%s = %s\n", key, strconv.Quote(v))
	}
}

func (t tomlWriter) val(key string, v any) { fmt.Fprintf(t.w, "%s = %v\n", key, v) }

func (t tomlWriter) list(key string, vs []string) {
	if vs == nil {
		return
	}
	quoted := make([]string, len(vs))
	for i, v := range vs {
		quoted[i] = strconv.Quote(v)
	}
	fmt.Fprintf(t.w, "%s = [%s]\n", key, strings.Join(quoted, ", "))
}

func (t tomlWriter) comment(format string, args ...any) {
	fmt.Fprintf(t.w, "# "+format+"\n", args...)
}

func (c *Config) writeAgent(w io.Writer, a Agent) {
	t := tomlWriter{w}
	table := "agents." + joinKey("", a.ID)
	t.table(table)
	t.str("name", a.Name)
	if a.Workspace == "" {
		t.comment("workspace: chosen by the scheduler (<state>/agents/%s)", a.ID)
	}
	t.str("workspace", a.Workspace)
	t.str("isolation", a.Isolation)
	t.val("timeout_seconds", int64(a.Timeout.Seconds()))
	t.str("provider", a.Provider)
	t.str("model", a.Model)
	t.val("max_iterations", a.MaxIterations)

	t.table(table + ".tools")
	t.list("allow", a.Tools.Allow)
	t.list("deny", a.Tools.Deny)

	t.table(table + ".container_mode")
	t.val("enabled", a.Container.Enabled)
	t.str("image", a.Container.Image)
	t.str("memory_limit", a.Container.MemoryLimit.String())
	t.str("network", a.Container.Network)
	t.str("runtime", a.Container.Runtime)
	t.val("warm", a.Container.Warm)
	t.list("binds", a.Container.Binds)
	t.list("security_opt", a.Container.SecurityOpt)

	t.table(table + ".file_access")
	t.val("unrestricted", a.FileAccess.Unrestricted)
	t.list("allow_read", a.FileAccess.AllowRead)
	t.list("allow_read_write", a.FileAccess.AllowReadWrite)
	t.list("deny", a.FileAccess.Deny)
	t.val("allow_home_dotfiles", a.FileAccess.AllowHomeDotfiles)
	t.val("allow_network", a.FileAccess.AllowNetwork)

	t.table(table + ".egress")
	t.list("allow", a.EgressAllow)

	t.table(table + ".sandbox")
	t.str("scope", a.Sandbox.Scope)
	if a.Sandbox.Conversation() {
		t.str("idle_stop", a.Sandbox.IdleStop.String())
		t.str("max_lifetime", a.Sandbox.MaxLifetime.String())
		t.val("max_per_agent", a.Sandbox.MaxPerAgent)
	} else if c.sandboxKeysSet(a.ID) {
		t.comment("scope = \"message\" ignores idle_stop, max_lifetime and max_per_agent: every message gets a fresh sandbox")
	}

	t.table(table + ".image_config")
	t.val("enabled", a.Image.Enabled)
	t.str("image", a.Image.Image)
	t.str("base_image", a.Image.BaseImage)
	t.list("packages", a.Image.Packages)
	if len(a.Image.EnvVars) > 0 {
		t.table(table + ".image_config.env_vars")
		for _, name := range slices.Sorted(maps.Keys(a.Image.EnvVars)) {
			t.val(joinKey("", name), strconv.Quote(a.Image.EnvVars[name]))
		}
	}

	for i, name := range c.chainNames(a) {
		p := c.Providers.Entries[name]
		t.table("providers." + joinKey("", name))
		if i == 0 {
			t.comment("the agent's provider")
		} else {
			t.comment("fallback %d", i)
		}
		t.str("kind", first(p.Kind, name))
		model := p.Model
		if i == 0 && a.Model != "" {
			model = a.Model
		}
		t.str("model", model)
		t.str("base_url", p.BaseURL)
		if p.MaxTokens > 0 {
			t.val("max_tokens", p.MaxTokens)
		}
		t.str("api_key_env", p.APIKeyEnv)
		if len(p.Endpoints) > 0 {
			t.list("endpoints", p.Endpoints)
		}
		t.str("api_version", p.APIVersion)
		t.str("organization", p.Organization)
		t.str("project", p.Project)
	}

	for _, k := range c.Connectors {
		var routes []string
		if k.DefaultAgent == a.ID {
			routes = append(routes, "default agent")
		}
		for _, b := range c.Bindings {
			if b.Agent == a.ID && (b.Connector == "" || b.Connector == k.ID) {
				routes = append(routes, bindingText(b))
			}
		}
		if len(routes) == 0 {
			continue
		}
		t.table("connectors." + joinKey("", k.ID))
		t.comment("routes here: %s", strings.Join(routes, "; "))
		t.connector(k)
	}
	if c.Intake.DefaultAgent == a.ID {
		t.table("intake")
		t.comment("messages no binding or connector routes come here")
		t.str("default_agent", a.ID)
	}
}

// writeSummary writes what holds for every agent: [retention] and the
// connectors.
func (c *Config) writeSummary(w io.Writer) {
	t := tomlWriter{w}
	r := c.Retention
	t.table("retention")
	t.val("finished_runs_days", int64(r.FinishedRuns/(24*time.Hour)))
	t.val("runs_per_agent", r.RunsPerAgent)
	t.val("delivered_hours", int64(r.Delivered/time.Hour))
	t.val("idle_conversation_days", int64(r.IdleConversation/(24*time.Hour)))
	for _, k := range c.Connectors {
		t.table("connectors." + joinKey("", k.ID))
		t.connector(k)
	}
}

// connector writes a connector's settings. Credentials show as their
// references ("$VAR", a credential name, a path), never their values; a
// webhook's inline secret shows as "(set)".
func (t tomlWriter) connector(k Connector) {
	t.str("type", k.Type)
	t.str("default_agent", k.DefaultAgent)
	if k.Type == ConnectorWebhook {
		if k.Secret != "" {
			t.str("secret", "(set)")
		}
		t.str("secret_file", k.SecretFile)
		t.str("reply_url", k.ReplyURL)
		return
	}
	t.str("base_url", k.BaseURL)
	t.str("gateway_url", k.GatewayURL)
	t.val("tls_verify", k.TLSVerify)
	t.str("ca_file", k.CAFile)
	for _, key := range k.Credentials() {
		ref, _ := k.CredentialRef(key)
		t.str(key, ref)
	}
	t.str("public_key", k.PublicKey)
	t.str("application_id", k.ApplicationID)
	t.list("guild_ids", k.GuildIDs)
	t.val("allow_bots", k.AllowBots)
	t.str("trigger", k.Trigger)
	t.str("mode", k.Mode)
}

func bindingText(b Binding) string {
	var parts []string
	if b.ChannelID != "" {
		parts = append(parts, "channel_id "+strconv.Quote(b.ChannelID))
	}
	if b.ChannelName != "" {
		parts = append(parts, "channel_name "+strconv.Quote(b.ChannelName))
	}
	if b.ServerID != "" {
		parts = append(parts, "server_id "+strconv.Quote(b.ServerID))
	}
	return "binding " + strings.Join(parts, ", ")
}
