package config

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
)

// loc is where a value was set: the file, its line and the full key.
type loc struct {
	file  string
	line  int
	key   string
	elems []int // for arrays: the line of each element
}

// elem is the location of an array's i-th element.
func (l loc) elem(i int) loc {
	e := loc{file: l.file, line: l.line, key: indexKey(l.key, i)}
	if i < len(l.elems) {
		e.line = l.elems[i]
	}
	return e
}

// fieldLocs records which fields a file set, keyed by the field's key
// relative to its table ("container_mode.network"). A field is "set" when it
// has an entry; merging copies exactly the set fields.
type fieldLocs map[string]loc

type providerEntry struct {
	p    Provider
	at   fieldLocs
	self loc // the [providers.NAME] table
}

type agentEntry struct {
	s    AgentSettings
	at   fieldLocs
	self loc // the [[agents]] element or [agent_defaults]
}

type connectorEntry struct {
	c    Connector
	at   fieldLocs
	self loc
}

type secretEntry struct {
	s    EgressSecret
	at   fieldLocs
	self loc
}

type bindingEntry struct {
	b    Binding
	at   fieldLocs
	self loc
}

// tree is one file's settings, or the merge of several, with where each
// value came from.
type tree struct {
	at            fieldLocs // top-level scalars, keyed like "scheduler.run_as"
	primary       string
	fallback      []string
	providers     map[string]*providerEntry
	providerNames []string // in order of first appearance
	defaults      agentEntry
	agents        []*agentEntry
	intake        Intake
	connectors    []*connectorEntry
	bindings      []*bindingEntry
	secrets       []*secretEntry

	maxConcurrentRuns     int
	defaultTimeoutSeconds int
	runAs                 string
	agentBinary           string
	egressBinary          string
	egressUser            string
	agentUIDs             string
	allowRlimitFallback   bool

	image ImageSettings // [image_config], keys in at like "image_config.packages"

	finishedRunsDays     int
	runsPerAgent         int
	deliveredHours       int
	idleConversationDays int
}

func newTree() *tree {
	return &tree{at: fieldLocs{}, providers: map[string]*providerEntry{}, defaults: agentEntry{at: fieldLocs{}}}
}

// keyPath is a key being decoded and the line it is on (its nearest
// ancestor's line when the key itself has none, as in inline tables).
type keyPath struct {
	key  string
	line int
}

// decoder turns one file's generic TOML data into a tree, checking types
// and reporting unknown keys.
type decoder struct {
	file  string
	lines map[string]int
	errs  Errors
}

func (d *decoder) child(p keyPath, name string) keyPath {
	return d.at(joinKey(p.key, name), p.line)
}

func (d *decoder) elem(p keyPath, i int) keyPath {
	return d.at(indexKey(p.key, i), p.line)
}

func (d *decoder) at(key string, fallbackLine int) keyPath {
	if line, ok := d.lines[key]; ok {
		return keyPath{key: key, line: line}
	}
	return keyPath{key: key, line: fallbackLine}
}

func (d *decoder) loc(p keyPath) loc { return loc{file: d.file, line: p.line, key: p.key} }

func (d *decoder) fail(p keyPath, format string, args ...any) {
	d.errs = append(d.errs, &Error{File: d.file, Line: p.line, Key: p.key, Msg: fmt.Sprintf(format, args...)})
}

func (d *decoder) wrongType(p keyPath, want string, v any) {
	d.fail(p, "must be %s, not %s", want, tomlType(v))
}

func tomlType(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case bool:
		return "a boolean"
	case map[string]any:
		return "a table"
	case []map[string]any:
		return "an array of tables"
	case []any:
		return "an array"
	case time.Time:
		return "a date-time"
	default:
		return "a date or time"
	}
}

// field decodes one value found at a key.
type field func(p keyPath, v any)

// table decodes a table whose keys are known in advance. other, when not
// nil, takes every key fields does not name.
func (d *decoder) table(p keyPath, v any, fields map[string]field, other func(name string, p keyPath, v any)) {
	m, ok := v.(map[string]any)
	if !ok {
		d.wrongType(p, "a table", v)
		return
	}
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		kp := d.child(p, name)
		switch f, known := fields[name]; {
		case known:
			f(kp, m[name])
		case other != nil:
			other(name, kp, m[name])
		default:
			d.fail(kp, "unknown key (known keys: %s)", strings.Join(slices.Sorted(maps.Keys(fields)), ", "))
		}
	}
}

// tables decodes an array of tables ([[agents]], or an inline array of
// inline tables), calling each for every element.
func (d *decoder) tables(p keyPath, v any, each func(p keyPath, v any)) {
	switch vs := v.(type) {
	case []map[string]any:
		for i, e := range vs {
			each(d.elem(p, i), e)
		}
	case []any:
		for i, e := range vs {
			each(d.elem(p, i), e)
		}
	default:
		d.wrongType(p, "an array of tables", v)
	}
}

func (d *decoder) str(at fieldLocs, name string, dst *string) field {
	return func(p keyPath, v any) {
		s, ok := v.(string)
		if !ok {
			d.wrongType(p, "a string", v)
			return
		}
		*dst = s
		at[name] = d.loc(p)
	}
}

// size reads a size key once, here, where its text and line are known, so
// nothing after has to parse it again.
func (d *decoder) size(at fieldLocs, name string, rule sizeRule, dst **Bytes) field {
	return func(p keyPath, v any) {
		s, ok := v.(string)
		if !ok {
			d.wrongType(p, "a string", v)
			return
		}
		n, msg := rule.check(s)
		if msg != "" {
			d.fail(p, "%s", msg)
			return
		}
		*dst = &n
		at[name] = d.loc(p)
	}
}

func (d *decoder) integer(at fieldLocs, name string, dst *int) field {
	return func(p keyPath, v any) {
		n, ok := v.(int64)
		if !ok {
			d.wrongType(p, "an integer", v)
			return
		}
		*dst = int(n)
		at[name] = d.loc(p)
	}
}

func (d *decoder) intPtr(at fieldLocs, name string, dst **int) field {
	var n int
	set := d.integer(at, name, &n)
	return func(p keyPath, v any) {
		set(p, v)
		if _, ok := at[name]; ok {
			*dst = &n
		}
	}
}

func (d *decoder) boolPtr(at fieldLocs, name string, dst **bool) field {
	return func(p keyPath, v any) {
		b, ok := v.(bool)
		if !ok {
			d.wrongType(p, "a boolean (true or false)", v)
			return
		}
		*dst = &b
		at[name] = d.loc(p)
	}
}

func (d *decoder) boolean(at fieldLocs, name string, dst *bool) field {
	return func(p keyPath, v any) {
		b, ok := v.(bool)
		if !ok {
			d.wrongType(p, "a boolean (true or false)", v)
			return
		}
		*dst = b
		at[name] = d.loc(p)
	}
}

func (d *decoder) ints(at fieldLocs, name string, dst *[]int) field {
	return func(p keyPath, v any) {
		vs, ok := v.([]any)
		if !ok {
			d.wrongType(p, "an array of integers", v)
			return
		}
		out := make([]int, 0, len(vs))
		l := d.loc(p)
		for i, e := range vs {
			n, ok := e.(int64)
			if !ok {
				d.wrongType(d.elem(p, i), "an integer", e)
				return
			}
			out = append(out, int(n))
			l.elems = append(l.elems, d.elem(p, i).line)
		}
		*dst = out
		at[name] = l
	}
}

func (d *decoder) strs(at fieldLocs, name string, dst *[]string) field {
	return func(p keyPath, v any) {
		vs, ok := v.([]any)
		if !ok {
			d.wrongType(p, "an array of strings", v)
			return
		}
		out := make([]string, 0, len(vs))
		l := d.loc(p)
		for i, e := range vs {
			s, ok := e.(string)
			if !ok {
				d.wrongType(d.elem(p, i), "a string", e)
				return
			}
			out = append(out, s)
			l.elems = append(l.elems, d.elem(p, i).line)
		}
		*dst = out
		at[name] = l
	}
}

// document decodes a whole file.
func (d *decoder) document(raw map[string]any) *tree {
	t := newTree()
	d.table(keyPath{}, raw, map[string]field{
		"providers":      func(p keyPath, v any) { d.providers(t, p, v) },
		"agent_defaults": func(p keyPath, v any) { t.defaults = d.agent(p, v, false) },
		"agents": func(p keyPath, v any) {
			d.tables(p, v, func(p keyPath, v any) {
				e := d.agent(p, v, true)
				t.agents = append(t.agents, &e)
			})
		},
		"intake": func(p keyPath, v any) {
			d.table(p, v, map[string]field{
				"listen":        d.str(t.at, "intake.listen", &t.intake.Listen),
				"default_agent": d.str(t.at, "intake.default_agent", &t.intake.DefaultAgent),
			}, nil)
		},
		"connectors": func(p keyPath, v any) {
			d.tables(p, v, func(p keyPath, v any) {
				e := &connectorEntry{at: fieldLocs{}, self: d.loc(p)}
				d.table(p, v, d.connectorFields(e), nil)
				t.connectors = append(t.connectors, e)
			})
		},
		"egress": func(p keyPath, v any) {
			d.table(p, v, map[string]field{
				"secrets": func(p keyPath, v any) {
					d.tables(p, v, func(p keyPath, v any) {
						e := &secretEntry{at: fieldLocs{}, self: d.loc(p)}
						d.table(p, v, map[string]field{
							"name":    d.str(e.at, "name", &e.s.Name),
							"env":     d.str(e.at, "env", &e.s.Env),
							"file":    d.str(e.at, "file", &e.s.File),
							"hosts":   d.strs(e.at, "hosts", &e.s.Hosts),
							"header":  d.str(e.at, "header", &e.s.Header),
							"format":  d.str(e.at, "format", &e.s.Format),
							"ports":   d.ints(e.at, "ports", &e.s.Ports),
							"methods": d.strs(e.at, "methods", &e.s.Methods),
							"paths":   d.strs(e.at, "paths", &e.s.Paths),
						}, nil)
						t.secrets = append(t.secrets, e)
					})
				},
			}, nil)
		},
		"bindings": func(p keyPath, v any) {
			d.tables(p, v, func(p keyPath, v any) {
				e := &bindingEntry{at: fieldLocs{}, self: d.loc(p)}
				d.table(p, v, map[string]field{
					"connector":    d.str(e.at, "connector", &e.b.Connector),
					"channel_id":   d.str(e.at, "channel_id", &e.b.ChannelID),
					"channel_name": d.str(e.at, "channel_name", &e.b.ChannelName),
					"server_id":    d.str(e.at, "server_id", &e.b.ServerID),
					"agent":        d.str(e.at, "agent", &e.b.Agent),
				}, nil)
				t.bindings = append(t.bindings, e)
			})
		},
		"scheduler": func(p keyPath, v any) {
			d.table(p, v, map[string]field{
				"max_concurrent_runs":     d.integer(t.at, "scheduler.max_concurrent_runs", &t.maxConcurrentRuns),
				"default_timeout_seconds": d.integer(t.at, "scheduler.default_timeout_seconds", &t.defaultTimeoutSeconds),
				"run_as":                  d.str(t.at, "scheduler.run_as", &t.runAs),
				"agent_binary":            d.str(t.at, "scheduler.agent_binary", &t.agentBinary),
				"egress_binary":           d.str(t.at, "scheduler.egress_binary", &t.egressBinary),
				"egress_user":             d.str(t.at, "scheduler.egress_user", &t.egressUser),
				"agent_uids":              d.str(t.at, "scheduler.agent_uids", &t.agentUIDs),
				"allow_rlimit_fallback":   d.boolean(t.at, "scheduler.allow_rlimit_fallback", &t.allowRlimitFallback),
			}, nil)
		},
		"image_config": func(p keyPath, v any) { d.imageConfig(t.at, p, v, &t.image) },
		"retention": func(p keyPath, v any) {
			d.table(p, v, map[string]field{
				"finished_runs_days":     d.integer(t.at, "retention.finished_runs_days", &t.finishedRunsDays),
				"runs_per_agent":         d.integer(t.at, "retention.runs_per_agent", &t.runsPerAgent),
				"delivered_hours":        d.integer(t.at, "retention.delivered_hours", &t.deliveredHours),
				"idle_conversation_days": d.integer(t.at, "retention.idle_conversation_days", &t.idleConversationDays),
			}, nil)
		},
	}, nil)
	return t
}

// imageConfig decodes [image_config] or [agents.image_config]. Each
// env_vars entry gets its own location ("image_config.env_vars.NAME").
func (d *decoder) imageConfig(at fieldLocs, p keyPath, v any, s *ImageSettings) {
	d.table(p, v, map[string]field{
		"enabled":    d.boolPtr(at, "image_config.enabled", &s.Enabled),
		"image":      d.str(at, "image_config.image", &s.Image),
		"base_image": d.str(at, "image_config.base_image", &s.BaseImage),
		"packages":   d.strs(at, "image_config.packages", &s.Packages),
		"env_vars": func(p keyPath, v any) {
			m, ok := v.(map[string]any)
			if !ok {
				d.wrongType(p, "a table of strings", v)
				return
			}
			vars := make(map[string]string, len(m))
			for _, name := range slices.Sorted(maps.Keys(m)) {
				kp := d.child(p, name)
				value, ok := m[name].(string)
				if !ok {
					d.wrongType(kp, "a string", m[name])
					continue
				}
				vars[name] = value
				at[envVarKey(name)] = d.loc(kp)
			}
			s.EnvVars = vars
			at["image_config.env_vars"] = d.loc(p)
		},
	}, nil)
}

// envVarKey is the fieldLocs name of one image_config.env_vars entry.
func envVarKey(name string) string { return joinKey("image_config.env_vars", name) }

// connectorFields are the keys of every connector type; which of them a
// connector may set depends on its type (connectorKeys), checked once the
// drop-ins are merged because the type may be set in another file.
func (d *decoder) connectorFields(e *connectorEntry) map[string]field {
	c := &e.c
	return map[string]field{
		"id":             d.str(e.at, "id", &c.ID),
		"type":           d.str(e.at, "type", &c.Type),
		"secret":         d.str(e.at, "secret", &c.Secret),
		"secret_file":    d.str(e.at, "secret_file", &c.SecretFile),
		"reply_url":      d.str(e.at, "reply_url", &c.ReplyURL),
		"default_agent":  d.str(e.at, "default_agent", &c.DefaultAgent),
		"base_url":       d.str(e.at, "base_url", &c.BaseURL),
		"gateway_url":    d.str(e.at, "gateway_url", &c.GatewayURL),
		"tls_verify":     d.boolean(e.at, "tls_verify", &c.TLSVerify),
		"ca_file":        d.str(e.at, "ca_file", &c.CAFile),
		"token":          d.str(e.at, "token", &c.Token),
		"app_token":      d.str(e.at, "app_token", &c.AppToken),
		"bot_token":      d.str(e.at, "bot_token", &c.BotToken),
		"signing_secret": d.str(e.at, "signing_secret", &c.SigningSecret),
		"public_key":     d.str(e.at, "public_key", &c.PublicKey),
		"application_id": d.str(e.at, "application_id", &c.ApplicationID),
		"guild_ids":      d.strs(e.at, "guild_ids", &c.GuildIDs),
		"allow_bots":     d.boolean(e.at, "allow_bots", &c.AllowBots),
		"trigger":        d.str(e.at, "trigger", &c.Trigger),
		"mode":           d.str(e.at, "mode", &c.Mode),
	}
}

func (d *decoder) providers(t *tree, p keyPath, v any) {
	d.table(p, v, map[string]field{
		"primary":  d.str(t.at, "providers.primary", &t.primary),
		"fallback": d.strs(t.at, "providers.fallback", &t.fallback),
	}, func(name string, p keyPath, v any) {
		if _, ok := v.(map[string]any); !ok {
			d.fail(p, "unknown key (known keys: fallback, primary; a provider is a table, [providers.%s])", joinKey("", name))
			return
		}
		e := &providerEntry{at: fieldLocs{}, self: d.loc(p)}
		d.table(p, v, map[string]field{
			"kind":         d.str(e.at, "kind", &e.p.Kind),
			"api_key_env":  d.str(e.at, "api_key_env", &e.p.APIKeyEnv),
			"model":        d.str(e.at, "model", &e.p.Model),
			"base_url":     d.str(e.at, "base_url", &e.p.BaseURL),
			"max_tokens":   d.integer(e.at, "max_tokens", &e.p.MaxTokens),
			"endpoints":    d.strs(e.at, "endpoints", &e.p.Endpoints),
			"api_version":  d.str(e.at, "api_version", &e.p.APIVersion),
			"organization": d.str(e.at, "organization", &e.p.Organization),
			"project":      d.str(e.at, "project", &e.p.Project),
		}, nil)
		e.p.Name = name
		t.providers[name] = e
		t.providerNames = append(t.providerNames, name)
	})
}

// secretsEnvKeys are MeepaGateway's keys that handed secrets to the
// sandbox's environment; berth adds secrets on the way out instead.
var secretsEnvKeys = []string{"inject_secrets_env", "inject_credentials_env"}

// refuseSecretsEnv is an agent table's handler of keys it does not know: it
// explains MeepaGateway's secret keys and reports any other as unknown.
func (d *decoder) refuseSecretsEnv(fields map[string]field) func(name string, p keyPath, v any) {
	return func(name string, p keyPath, v any) {
		if slices.Contains(secretsEnvKeys, name) {
			d.fail(p, "berth never puts secrets into a sandbox's environment: bind the secret to its hosts in [[egress.secrets]] and the egress proxy adds it on the way out")
			return
		}
		d.fail(p, "unknown key (known keys: %s)", strings.Join(slices.Sorted(maps.Keys(fields)), ", "))
	}
}

// agent decodes [agent_defaults] (withID false) or one [[agents]] element.
func (d *decoder) agent(p keyPath, v any, withID bool) agentEntry {
	e := agentEntry{at: fieldLocs{}, self: d.loc(p)}
	s := &e.s
	fields := map[string]field{
		"name":            d.str(e.at, "name", &s.Name),
		"workspace":       d.str(e.at, "workspace", &s.Workspace),
		"provider":        d.str(e.at, "provider", &s.Provider),
		"model":           d.str(e.at, "model", &s.Model),
		"max_iterations":  d.intPtr(e.at, "max_iterations", &s.MaxIterations),
		"workspace_quota": d.size(e.at, "workspace_quota", workspaceQuotaRule, &s.WorkspaceQuota),
		"tools": func(p keyPath, v any) {
			d.table(p, v, map[string]field{
				"allow": d.strs(e.at, "tools.allow", &s.Tools.Allow),
				"deny":  d.strs(e.at, "tools.deny", &s.Tools.Deny),
			}, nil)
		},
		"container_mode": func(p keyPath, v any) {
			c := &s.ContainerMode
			cf := map[string]field{
				"enabled":         d.boolPtr(e.at, "container_mode.enabled", &c.Enabled),
				"image":           d.str(e.at, "container_mode.image", &c.Image),
				"memory_limit":    d.size(e.at, "container_mode.memory_limit", memoryLimitRule, &c.MemoryLimit),
				"timeout_seconds": d.intPtr(e.at, "container_mode.timeout_seconds", &c.TimeoutSeconds),
				"network":         d.str(e.at, "container_mode.network", &c.Network),
				"runtime":         d.str(e.at, "container_mode.runtime", &c.Runtime),
				"warm":            d.intPtr(e.at, "container_mode.warm", &c.Warm),
				"binds":           d.strs(e.at, "container_mode.binds", &c.Binds),
				"security_opt":    d.strs(e.at, "container_mode.security_opt", &c.SecurityOpt),
			}
			d.table(p, v, cf, d.refuseSecretsEnv(cf))
		},
		"file_access": func(p keyPath, v any) {
			f := &s.FileAccess
			d.table(p, v, map[string]field{
				"unrestricted":        d.boolPtr(e.at, "file_access.unrestricted", &f.Unrestricted),
				"allow_read":          d.strs(e.at, "file_access.allow_read", &f.AllowRead),
				"allow_read_write":    d.strs(e.at, "file_access.allow_read_write", &f.AllowReadWrite),
				"deny":                d.strs(e.at, "file_access.deny", &f.Deny),
				"allow_home_dotfiles": d.boolPtr(e.at, "file_access.allow_home_dotfiles", &f.AllowHomeDotfiles),
				"allow_network":       d.boolPtr(e.at, "file_access.allow_network", &f.AllowNetwork),
			}, nil)
		},
		"egress": func(p keyPath, v any) {
			d.table(p, v, map[string]field{
				"allow": d.strs(e.at, "egress.allow", &s.Egress.Allow),
			}, nil)
		},
	}
	if withID {
		fields["id"] = d.str(e.at, "id", &s.ID)
		fields["image_config"] = func(p keyPath, v any) { d.imageConfig(e.at, p, v, &s.ImageConfig) }
	}
	d.table(p, v, fields, d.refuseSecretsEnv(fields))
	return e
}
