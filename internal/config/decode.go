package config

import (
	"fmt"
	"reflect"
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

// entry is a table of its own: [agent_defaults], one [[agents]] element,
// one [providers.NAME]. Its fieldLocs are relative to it, and self is where
// the table itself is, for errors about a key it lacks.
type entry[T any] struct {
	v    T
	at   fieldLocs
	self loc
}

// entryValue is what the walker needs of an *entry[T] of any T.
type entryValue interface {
	init(self loc)
	value() reflect.Value // the addressable T
	locs() fieldLocs
	selfLoc() *loc
}

func (e *entry[T]) init(self loc)        { e.at, e.self = fieldLocs{}, self }
func (e *entry[T]) value() reflect.Value { return reflect.ValueOf(&e.v).Elem() }
func (e *entry[T]) locs() fieldLocs      { return e.at }
func (e *entry[T]) selfLoc() *loc        { return &e.self }

// document is a whole berth.toml: one field per top-level table. A new
// table is a new field here (and its resolution in tree.config).
type document struct {
	Providers     providerSettings           `toml:"providers"`
	AgentDefaults *entry[AgentSettings]      `toml:"agent_defaults" berth:"omit=id|image_config"`
	Agents        []*entry[AgentSettings]    `toml:"agents" berth:"merge=id"`
	Intake        Intake                     `toml:"intake"`
	Connectors    []*entry[Connector]        `toml:"connectors" berth:"merge=id"`
	Egress        egressSettings             `toml:"egress"`
	Bindings      []*entry[Binding]          `toml:"bindings"`
	Scheduler     schedulerSettings          `toml:"scheduler"`
	ImageConfig   ImageSettings              `toml:"image_config"`
	Retention     retentionSettings          `toml:"retention"`
	Tracing       Tracing                    `toml:"tracing"`
	Kubernetes    Kubernetes                 `toml:"kubernetes"`
	Schedules     []*entry[ScheduleSettings] `toml:"schedules" berth:"merge=id"`
	Approvers     []*entry[ApproverSettings] `toml:"approvers"`
}

// providerSettings is [providers]: its own keys, and every other key is a
// [providers.NAME] table.
type providerSettings struct {
	Primary  string             `toml:"primary" berth:"check=nonEmpty"`
	Fallback []string           `toml:"fallback" berth:"check=nonEmpty"`
	Entries  []*entry[Provider] `berth:"rest=provider"`
}

// egressSettings is [egress].
type egressSettings struct {
	Secrets    []*entry[EgressSecret] `toml:"secrets"`
	GitHubApps []*entry[GitHubApp]    `toml:"github_apps" berth:"merge=name"`
}

// schedulerSettings is [scheduler] as written; Scheduler is its resolution.
type schedulerSettings struct {
	MaxConcurrentRuns     *int      `toml:"max_concurrent_runs" berth:"check=atLeastOne"`
	DefaultTimeoutSeconds *int      `toml:"default_timeout_seconds" berth:"check=seconds"`
	RunAs                 string    `toml:"run_as" berth:"check=runAs"`
	AgentBinary           string    `toml:"agent_binary" berth:"check=absolutePath"`
	EgressBinary          string    `toml:"egress_binary" berth:"check=absolutePath"`
	EgressUser            string    `toml:"egress_user" berth:"check=egressUser"`
	AgentUIDs             *UIDRange `toml:"agent_uids"`
	AllowRlimitFallback   bool      `toml:"allow_rlimit_fallback"`
	RunsCPUWeight         *int      `toml:"runs_cpu_weight" berth:"check=cpuWeight"`
	MaxReplyFileBytes     *Bytes    `toml:"max_reply_file_bytes" berth:"check=replyFileSize"`
	MaxReplyFilesBytes    *Bytes    `toml:"max_reply_files_bytes" berth:"check=replyFileSize"`
}

// retentionSettings is [retention] as written; Retention is its resolution.
type retentionSettings struct {
	FinishedRunsDays     *int `toml:"finished_runs_days" berth:"check=retentionDays"`
	RunsPerAgent         *int `toml:"runs_per_agent" berth:"check=runsPerAgent"`
	DeliveredHours       *int `toml:"delivered_hours" berth:"check=deliveredHours"`
	IdleConversationDays *int `toml:"idle_conversation_days" berth:"check=retentionDays"`
}

// tree is one file's settings, or the merge of several, with where each
// value came from; its own fieldLocs hold the top-level tables' keys
// ("scheduler.run_as").
type tree struct{ entry[document] }

func newTree() *tree {
	t := &tree{entry[document]{at: fieldLocs{}}}
	allocateEntries(t.value())
	return t
}

// merge applies a later file on top of t.
func (t *tree) merge(src *tree) { mergeEntry(t, src) }

func (t *tree) provider(name string) (*entry[Provider], bool) {
	for _, e := range t.v.Providers.Entries {
		if e.v.Name == name {
			return e, true
		}
	}
	return nil, false
}

// keyPath is a key being decoded and the line it is on (its nearest
// ancestor's line when the key itself has none, as in inline tables).
type keyPath struct {
	key  string
	line int
}

// decoder turns one file's generic TOML data into a tree, checking types
// and values and reporting unknown keys.
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

// document decodes a whole file.
func (d *decoder) document(raw map[string]any) *tree {
	t := newTree()
	d.decodeTable(keyPath{}, raw, t.value(), t.at, "", nil)
	return t
}

// envVarKey is the fieldLocs name of one image_config.env_vars entry.
func envVarKey(name string) string { return joinKey("image_config.env_vars", name) }

// secretsEnvKeys are MeepaGateway's keys that handed secrets to the
// sandbox's environment; berth adds secrets on the way out instead.
var secretsEnvKeys = []string{"inject_secrets_env", "inject_credentials_env"}

func explainSecretsEnv(name string) (string, bool) {
	for _, k := range secretsEnvKeys {
		if name == k {
			return "berth never puts secrets into a sandbox's environment: bind the secret to its hosts in [[egress.secrets]] and the egress proxy adds it on the way out", true
		}
	}
	return "", false
}

func (*AgentSettings) explainUnknownKey(name string) (string, bool) { return explainSecretsEnv(name) }
func (*ContainerSettings) explainUnknownKey(name string) (string, bool) {
	return explainSecretsEnv(name)
}
