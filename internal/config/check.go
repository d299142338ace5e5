package config

import (
	"encoding"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
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
	t.str("isolation", a.Isolation) // not a key: which backend the keys below choose
	notes := map[string]string{}
	if a.Workspace == "" {
		notes["workspace"] = fmt.Sprintf("workspace: chosen by the scheduler (<state>/agents/%s)", a.ID)
	}
	if !a.Sandbox.Conversation() && c.sandboxKeysSet(a.ID) {
		notes["sandbox.idle_stop"] = `scope = "message" ignores idle_stop, max_lifetime and max_per_agent: every message gets a fresh sandbox`
	}
	settings := settingsOf(a)
	t.settings(table, "", reflect.ValueOf(&settings).Elem(), notes)

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

// settingsOf is a resolved agent as the settings that give it, every key
// that has a value set: config check writes them by walking their tags, so
// a key is named once, in its field. A key no line here fills is missing
// from the output (TestConfigCheckShowsEveryAgentKey fails).
func settingsOf(a Agent) AgentSettings {
	timeout := int(a.Timeout / time.Second)
	s := AgentSettings{
		Name:          a.Name,
		Workspace:     a.Workspace,
		Provider:      a.Provider,
		Model:         a.Model,
		MaxIterations: &a.MaxIterations,
		Tools:         a.Tools,
		ContainerMode: ContainerSettings{
			Enabled:        &a.Container.Enabled,
			Image:          a.Container.Image,
			MemoryLimit:    &a.Container.MemoryLimit,
			TimeoutSeconds: &timeout,
			Network:        NetworkMode(a.Container.Network),
			Runtime:        a.Container.Runtime,
			Warm:           &a.Container.Warm,
			Binds:          a.Container.Binds,
			SecurityOpt:    a.Container.SecurityOpt,
		},
		FileAccess: FileAccessSettings{
			Unrestricted:      &a.FileAccess.Unrestricted,
			AllowRead:         a.FileAccess.AllowRead,
			AllowReadWrite:    a.FileAccess.AllowReadWrite,
			Deny:              a.FileAccess.Deny,
			AllowHomeDotfiles: &a.FileAccess.AllowHomeDotfiles,
			AllowNetwork:      &a.FileAccess.AllowNetwork,
		},
		WorkspaceQuota: &a.WorkspaceQuota,
		ImageConfig: ImageSettings{
			Enabled:   &a.Image.Enabled,
			Image:     a.Image.Image,
			BaseImage: a.Image.BaseImage,
			Packages:  a.Image.Packages,
			EnvVars:   a.Image.EnvVars,
		},
		Egress:  egressSettingsOf(a),
		Sandbox: SandboxSettings{Scope: a.Sandbox.Scope},
		MCP:     a.MCP,
		Budget:  budgetSettingsOf(a.Budget),
		Backend: BackendLocal,
	}
	if a.Isolation == BackendKubernetes {
		s.Backend = BackendKubernetes
	}
	if ws := a.WebSearch; ws != nil {
		s.WebSearch = WebSearchSettings{Provider: ws.Provider, BaseURL: ws.BaseURL, Secret: ws.Secret}
	}
	// Only a conversation's sandbox is kept, so only it has these.
	if a.Sandbox.Conversation() {
		idle, lifetime := Duration(a.Sandbox.IdleStop), Duration(a.Sandbox.MaxLifetime)
		s.Sandbox.IdleStop, s.Sandbox.MaxLifetime, s.Sandbox.MaxPerAgent = &idle, &lifetime, &a.Sandbox.MaxPerAgent
	}
	return s
}

// settings writes the keys of v, a table's struct, that have a value: its
// own keys first, then each sub-table under its header. rel is v's key
// relative to the agent's table; notes are comments keyed the same way,
// written where the key's line goes (or under the sub-table's header).
func (t tomlWriter) settings(table, rel string, v reflect.Value, notes map[string]string) {
	specs := specsOf(v.Type())
	for _, f := range specs {
		key := joinKey(rel, f.key)
		if note, ok := notes[key]; ok && (f.kind == kindLeaf || f.kind == kindList) {
			t.comment("%s", note)
		}
		fv := v.Field(f.index)
		switch {
		case f.key == "id":
			// The table's name.
		case f.kind == kindLeaf:
			t.leaf(f.key, fv)
		case f.kind == kindList && !fv.IsNil():
			t.w.Write([]byte(f.key + " = " + listText(fv) + "\n"))
		}
	}
	for _, f := range specs {
		key, fv := joinKey(rel, f.key), v.Field(f.index)
		switch f.kind {
		case kindSection:
			t.table(table + "." + joinKey("", f.key))
			if note, ok := notes[key]; ok {
				t.comment("%s", note)
			}
			t.settings(table+"."+joinKey("", f.key), key, fv, notes)
		case kindStrings:
			if fv.Len() == 0 {
				continue
			}
			t.table(table + "." + joinKey("", f.key))
			m := fv.Interface().(map[string]string)
			for _, name := range slices.Sorted(maps.Keys(m)) {
				t.val(joinKey("", name), strconv.Quote(m[name]))
			}
		case kindTables:
			for i := range fv.Len() {
				fmt.Fprintf(t.w, "\n[[%s.%s]]\n", table, joinKey("", f.key))
				t.settings(table+"."+joinKey("", f.key), indexKey(key, i), fv.Index(i), notes)
			}
		}
	}
}

// leaf writes one key's value as TOML, typed values as the text they are
// read from ("512m", "15m0s"); nothing when it is unset or an empty string.
func (t tomlWriter) leaf(key string, v reflect.Value) {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	if m, ok := v.Interface().(encoding.TextMarshaler); ok {
		text, _ := m.MarshalText()
		t.str(key, string(text))
		return
	}
	if v.Kind() == reflect.String {
		t.str(key, v.String())
		return
	}
	t.val(key, v.Interface())
}

// listText is a list of strings or integers in TOML syntax.
func listText(v reflect.Value) string {
	items := make([]string, v.Len())
	for i := range v.Len() {
		if e := v.Index(i); e.Kind() == reflect.String {
			items[i] = strconv.Quote(e.String())
		} else {
			items[i] = fmt.Sprint(e.Interface())
		}
	}
	return "[" + strings.Join(items, ", ") + "]"
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
	t.str("progress", k.Progress)
	t.val("reactions", k.Reactions)
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
