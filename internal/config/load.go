package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// DefaultPath is where berth's daemons and berthctl read the configuration.
const DefaultPath = "/etc/berth/berth.toml"

// Built-in defaults, used when neither an agent nor [agent_defaults] nor the
// [scheduler] table says otherwise.
const (
	defaultMaxIterations     = 10
	defaultNetwork           = "bridge"
	defaultMaxConcurrentRuns = 4
	defaultTimeout           = 300 * time.Second
	defaultRunAs             = "berth-agent"
	defaultAgentBinary       = "/usr/libexec/berth/berth-agent"
	defaultEgressUser        = "berth-egress"
	localProvider            = "local"
	// DefaultBaseImage is image_config's base_image when none is set: the
	// Debian 12 image scripts/base-image.sh builds offline.
	DefaultBaseImage = "berth-base:bookworm"

	defaultFinishedRunsDays     = 30
	defaultRunsPerAgent         = 10000
	defaultDeliveredHours       = 72
	defaultIdleConversationDays = 30
	// minDeliveredHours: a platform may redeliver an event for a day, and a
	// forgotten message id would run it twice.
	minDeliveredHours = 24
)

// Built-in sizes, the only place they are declared: backends take the
// resolved value and refuse a zero one rather than default it again.
const (
	// DefaultMemoryLimit is container_mode.memory_limit when none is set,
	// for host runs too.
	DefaultMemoryLimit Bytes = 512 << 20
	// defaultWorkspaceQuota is workspace_quota when none is set.
	defaultWorkspaceQuota Bytes = 1 << 30
)

// defaultBaseURLs are the platforms' public APIs; MeepaChat is self-hosted
// and has none.
var defaultBaseURLs = map[string]string{
	ConnectorDiscord: "https://discord.com/api/v10",
	ConnectorSlack:   "https://slack.com/api/",
}

// Load reads path and then the drop-ins <dir of path>/berth.d/*.toml in
// lexical order, later files overriding earlier ones, and validates the
// result. Its error is an Errors listing every problem found.
func Load(path string) (*Config, error) {
	files := []string{path}
	var errs Errors
	dropIns, err := filepath.Glob(filepath.Join(filepath.Dir(path), "berth.d", "*.toml"))
	if err != nil {
		return nil, Errors{{File: path, Msg: fmt.Sprintf("cannot list drop-ins: %v", err), err: err}}
	}
	for _, f := range dropIns {
		if strings.HasPrefix(filepath.Base(f), ".") {
			continue // hidden files: editor and package manager leftovers
		}
		if info, err := os.Stat(f); err == nil && info.IsDir() {
			continue
		}
		files = append(files, f)
	}

	merged := newTree()
	var sources []string
	for _, f := range files {
		t, ferrs := decodeFile(f)
		errs = append(errs, ferrs...)
		if t == nil {
			continue
		}
		sources = append(sources, f)
		merged.merge(t)
	}
	errs = append(errs, merged.validateMerged()...)
	if len(errs) > 0 {
		sortErrors(errs, files)
		return nil, errs
	}
	c := merged.config()
	c.Sources = sources
	return c, nil
}

// decodeFile reads, parses, decodes and checks the values of one file. It
// returns a nil tree when the file cannot be read or parsed.
func decodeFile(file string) (*tree, Errors) {
	data, err := os.ReadFile(file)
	if err != nil {
		msg := err.Error()
		if errors.Is(err, fs.ErrNotExist) {
			msg = "file does not exist"
		} else if pe, ok := errors.AsType[*fs.PathError](err); ok {
			msg = "cannot read: " + pe.Err.Error()
		}
		return nil, Errors{{File: file, Msg: msg, err: err}}
	}
	text := string(data)
	var raw map[string]any
	if _, err := toml.Decode(text, &raw); err != nil {
		e := &Error{File: file, Msg: err.Error(), err: err}
		if pe, ok := errors.AsType[toml.ParseError](err); ok {
			e.Line = pe.Position.Line
			if pe.Position.Start <= len(text) {
				// The parser counts a newline it stops at into the next line.
				e.Line = strings.Count(text[:pe.Position.Start], "\n") + 1
			}
			e.Msg = pe.Message
		}
		return nil, Errors{e}
	}
	d := &decoder{file: file, lines: keyLines(text)}
	t := d.document(raw)
	d.errs = append(d.errs, t.validateValues()...)
	return t, d.errs
}

// sortErrors orders errors by file (in the order files were read) and line,
// keeping the order in which they were found otherwise.
func sortErrors(errs Errors, files []string) {
	rank := func(file string) int {
		if i := slices.Index(files, file); i >= 0 {
			return i
		}
		return len(files)
	}
	slices.SortStableFunc(errs, func(a, b *Error) int {
		if ra, rb := rank(a.File), rank(b.File); ra != rb {
			return ra - rb
		}
		return a.Line - b.Line
	})
}

// take copies src's field name into dst when src set it.
func take[T any](dst *T, src T, name string, dstAt, srcAt fieldLocs) {
	if l, ok := srcAt[name]; ok {
		*dst = src
		dstAt[name] = l
	}
}

// merge applies a later file on top of t.
func (t *tree) merge(src *tree) {
	take(&t.primary, src.primary, "providers.primary", t.at, src.at)
	take(&t.fallback, src.fallback, "providers.fallback", t.at, src.at)
	take(&t.intake.Listen, src.intake.Listen, "intake.listen", t.at, src.at)
	take(&t.intake.DefaultAgent, src.intake.DefaultAgent, "intake.default_agent", t.at, src.at)
	take(&t.maxConcurrentRuns, src.maxConcurrentRuns, "scheduler.max_concurrent_runs", t.at, src.at)
	take(&t.defaultTimeoutSeconds, src.defaultTimeoutSeconds, "scheduler.default_timeout_seconds", t.at, src.at)
	take(&t.runAs, src.runAs, "scheduler.run_as", t.at, src.at)
	take(&t.agentBinary, src.agentBinary, "scheduler.agent_binary", t.at, src.at)
	take(&t.egressBinary, src.egressBinary, "scheduler.egress_binary", t.at, src.at)
	take(&t.egressUser, src.egressUser, "scheduler.egress_user", t.at, src.at)
	take(&t.agentUIDs, src.agentUIDs, "scheduler.agent_uids", t.at, src.at)
	take(&t.allowRlimitFallback, src.allowRlimitFallback, "scheduler.allow_rlimit_fallback", t.at, src.at)
	take(&t.finishedRunsDays, src.finishedRunsDays, "retention.finished_runs_days", t.at, src.at)
	take(&t.runsPerAgent, src.runsPerAgent, "retention.runs_per_agent", t.at, src.at)
	take(&t.deliveredHours, src.deliveredHours, "retention.delivered_hours", t.at, src.at)
	take(&t.idleConversationDays, src.idleConversationDays, "retention.idle_conversation_days", t.at, src.at)
	mergeImage(&t.image, &src.image, t.at, src.at)

	for _, name := range src.providerNames {
		s := src.providers[name]
		d, ok := t.providers[name]
		if !ok {
			d = &providerEntry{p: Provider{Name: name}, at: fieldLocs{}, self: s.self}
			t.providers[name] = d
			t.providerNames = append(t.providerNames, name)
		}
		take(&d.p.Kind, s.p.Kind, "kind", d.at, s.at)
		take(&d.p.APIKeyEnv, s.p.APIKeyEnv, "api_key_env", d.at, s.at)
		take(&d.p.Model, s.p.Model, "model", d.at, s.at)
		take(&d.p.BaseURL, s.p.BaseURL, "base_url", d.at, s.at)
		take(&d.p.MaxTokens, s.p.MaxTokens, "max_tokens", d.at, s.at)
		take(&d.p.Endpoints, s.p.Endpoints, "endpoints", d.at, s.at)
		take(&d.p.APIVersion, s.p.APIVersion, "api_version", d.at, s.at)
		take(&d.p.Organization, s.p.Organization, "organization", d.at, s.at)
		take(&d.p.Project, s.p.Project, "project", d.at, s.at)
	}

	if t.defaults.self.file == "" {
		t.defaults.self = src.defaults.self
	}
	mergeAgent(&t.defaults, &src.defaults)
	for _, s := range src.agents {
		i := slices.IndexFunc(t.agents, func(d *agentEntry) bool { return s.s.ID != "" && d.s.ID == s.s.ID })
		if i < 0 {
			t.agents = append(t.agents, &agentEntry{at: fieldLocs{}, self: s.self})
			i = len(t.agents) - 1
		}
		mergeAgent(t.agents[i], s)
	}

	for _, s := range src.connectors {
		i := slices.IndexFunc(t.connectors, func(d *connectorEntry) bool { return s.c.ID != "" && d.c.ID == s.c.ID })
		if i < 0 {
			t.connectors = append(t.connectors, &connectorEntry{at: fieldLocs{}, self: s.self})
			i = len(t.connectors) - 1
		}
		d := t.connectors[i]
		take(&d.c.ID, s.c.ID, "id", d.at, s.at)
		take(&d.c.Type, s.c.Type, "type", d.at, s.at)
		take(&d.c.Secret, s.c.Secret, "secret", d.at, s.at)
		take(&d.c.SecretFile, s.c.SecretFile, "secret_file", d.at, s.at)
		take(&d.c.ReplyURL, s.c.ReplyURL, "reply_url", d.at, s.at)
		take(&d.c.DefaultAgent, s.c.DefaultAgent, "default_agent", d.at, s.at)
		take(&d.c.BaseURL, s.c.BaseURL, "base_url", d.at, s.at)
		take(&d.c.GatewayURL, s.c.GatewayURL, "gateway_url", d.at, s.at)
		take(&d.c.TLSVerify, s.c.TLSVerify, "tls_verify", d.at, s.at)
		take(&d.c.CAFile, s.c.CAFile, "ca_file", d.at, s.at)
		take(&d.c.Token, s.c.Token, "token", d.at, s.at)
		take(&d.c.AppToken, s.c.AppToken, "app_token", d.at, s.at)
		take(&d.c.BotToken, s.c.BotToken, "bot_token", d.at, s.at)
		take(&d.c.SigningSecret, s.c.SigningSecret, "signing_secret", d.at, s.at)
		take(&d.c.PublicKey, s.c.PublicKey, "public_key", d.at, s.at)
		take(&d.c.ApplicationID, s.c.ApplicationID, "application_id", d.at, s.at)
		take(&d.c.GuildIDs, s.c.GuildIDs, "guild_ids", d.at, s.at)
		take(&d.c.AllowBots, s.c.AllowBots, "allow_bots", d.at, s.at)
		take(&d.c.Trigger, s.c.Trigger, "trigger", d.at, s.at)
		take(&d.c.Mode, s.c.Mode, "mode", d.at, s.at)
	}

	t.bindings = append(t.bindings, src.bindings...)
	t.secrets = append(t.secrets, src.secrets...)
}

func mergeAgent(d, s *agentEntry) {
	take(&d.s.ID, s.s.ID, "id", d.at, s.at)
	take(&d.s.Name, s.s.Name, "name", d.at, s.at)
	take(&d.s.Workspace, s.s.Workspace, "workspace", d.at, s.at)
	take(&d.s.Provider, s.s.Provider, "provider", d.at, s.at)
	take(&d.s.Model, s.s.Model, "model", d.at, s.at)
	take(&d.s.MaxIterations, s.s.MaxIterations, "max_iterations", d.at, s.at)
	take(&d.s.WorkspaceQuota, s.s.WorkspaceQuota, "workspace_quota", d.at, s.at)
	take(&d.s.Tools.Allow, s.s.Tools.Allow, "tools.allow", d.at, s.at)
	take(&d.s.Tools.Deny, s.s.Tools.Deny, "tools.deny", d.at, s.at)
	dc, sc := &d.s.ContainerMode, &s.s.ContainerMode
	take(&dc.Enabled, sc.Enabled, "container_mode.enabled", d.at, s.at)
	take(&dc.Image, sc.Image, "container_mode.image", d.at, s.at)
	take(&dc.MemoryLimit, sc.MemoryLimit, "container_mode.memory_limit", d.at, s.at)
	take(&dc.TimeoutSeconds, sc.TimeoutSeconds, "container_mode.timeout_seconds", d.at, s.at)
	take(&dc.Network, sc.Network, "container_mode.network", d.at, s.at)
	take(&dc.Runtime, sc.Runtime, "container_mode.runtime", d.at, s.at)
	take(&dc.Warm, sc.Warm, "container_mode.warm", d.at, s.at)
	take(&dc.Binds, sc.Binds, "container_mode.binds", d.at, s.at)
	take(&dc.SecurityOpt, sc.SecurityOpt, "container_mode.security_opt", d.at, s.at)
	df, sf := &d.s.FileAccess, &s.s.FileAccess
	take(&df.Unrestricted, sf.Unrestricted, "file_access.unrestricted", d.at, s.at)
	take(&df.AllowRead, sf.AllowRead, "file_access.allow_read", d.at, s.at)
	take(&df.AllowReadWrite, sf.AllowReadWrite, "file_access.allow_read_write", d.at, s.at)
	take(&df.Deny, sf.Deny, "file_access.deny", d.at, s.at)
	take(&df.AllowHomeDotfiles, sf.AllowHomeDotfiles, "file_access.allow_home_dotfiles", d.at, s.at)
	take(&df.AllowNetwork, sf.AllowNetwork, "file_access.allow_network", d.at, s.at)
	take(&d.s.Egress.Allow, s.s.Egress.Allow, "egress.allow", d.at, s.at)
	mergeImage(&d.s.ImageConfig, &s.s.ImageConfig, d.at, s.at)
}

// mergeImage applies a later file's image_config; env_vars is replaced as a
// whole, with the locations of its entries.
func mergeImage(d, s *ImageSettings, dAt, sAt fieldLocs) {
	take(&d.Enabled, s.Enabled, "image_config.enabled", dAt, sAt)
	take(&d.Image, s.Image, "image_config.image", dAt, sAt)
	take(&d.BaseImage, s.BaseImage, "image_config.base_image", dAt, sAt)
	take(&d.Packages, s.Packages, "image_config.packages", dAt, sAt)
	if _, ok := sAt["image_config.env_vars"]; ok {
		for name := range d.EnvVars {
			delete(dAt, envVarKey(name))
		}
		for name := range s.EnvVars {
			dAt[envVarKey(name)] = sAt[envVarKey(name)]
		}
		take(&d.EnvVars, s.EnvVars, "image_config.env_vars", dAt, sAt)
	}
}

// config builds the Config of a merged, valid tree, filling the scheduler
// defaults and the implicit "local" provider.
func (t *tree) config() *Config {
	c := &Config{
		Providers: Providers{
			Primary:  t.primary,
			Fallback: t.fallback,
			Entries:  map[string]Provider{localProvider: {Name: localProvider, Kind: "local"}},
		},
		AgentDefaults: t.defaults.s,
		Intake:        t.intake,
		ImageConfig:   t.image,
		Scheduler: Scheduler{
			MaxConcurrentRuns: t.maxConcurrentRuns,
			DefaultTimeout:    time.Duration(t.defaultTimeoutSeconds) * time.Second,
			RunAs:             t.runAs,
			AgentBinary:       t.agentBinary,
			EgressBinary:      t.egressBinary,
			EgressUser:        t.egressUser,
			// Checked by validate: a bad range never gets here.
			AgentUIDs:           agentUIDsOf(t.agentUIDs),
			AllowRlimitFallback: t.allowRlimitFallback,
		},
	}
	for _, name := range t.providerNames {
		p := t.providers[name].p
		if p.Kind == "" {
			p.Kind = name // validated: name is a kind
		}
		c.Providers.Entries[name] = p
	}
	for _, a := range t.agents {
		c.Agents = append(c.Agents, a.s)
	}
	for _, e := range t.connectors {
		c.Connectors = append(c.Connectors, e.connector())
	}
	for _, b := range t.bindings {
		c.Bindings = append(c.Bindings, b.b)
	}
	for _, e := range t.secrets {
		s := e.s
		if s.Header == "" {
			s.Header = "Authorization"
		}
		if s.Format == "" {
			s.Format = "Bearer {}"
		}
		c.EgressSecrets = append(c.EgressSecrets, s)
	}
	if _, ok := t.at["scheduler.max_concurrent_runs"]; !ok {
		c.Scheduler.MaxConcurrentRuns = defaultMaxConcurrentRuns
	}
	if _, ok := t.at["scheduler.default_timeout_seconds"]; !ok {
		c.Scheduler.DefaultTimeout = defaultTimeout
	}
	if c.Scheduler.RunAs == "" {
		c.Scheduler.RunAs = defaultRunAs
	}
	if c.Scheduler.AgentBinary == "" {
		c.Scheduler.AgentBinary = defaultAgentBinary
	}
	if c.Scheduler.EgressBinary == "" {
		c.Scheduler.EgressBinary = filepath.Join(filepath.Dir(c.Scheduler.AgentBinary), "berth-egress")
	}
	if c.Scheduler.EgressUser == "" {
		c.Scheduler.EgressUser = defaultEgressUser
	}
	c.Retention = t.retention()
	return c
}

// retention returns [retention] with the default of every key not set.
func (t *tree) retention() Retention {
	setOr := func(name string, v, def int) int {
		if _, ok := t.at[name]; ok {
			return v
		}
		return def
	}
	const day = 24 * time.Hour
	return Retention{
		FinishedRuns:     time.Duration(setOr("retention.finished_runs_days", t.finishedRunsDays, defaultFinishedRunsDays)) * day,
		RunsPerAgent:     setOr("retention.runs_per_agent", t.runsPerAgent, defaultRunsPerAgent),
		Delivered:        time.Duration(setOr("retention.delivered_hours", t.deliveredHours, defaultDeliveredHours)) * time.Hour,
		IdleConversation: time.Duration(setOr("retention.idle_conversation_days", t.idleConversationDays, defaultIdleConversationDays)) * day,
	}
}

// connector returns a merged, valid connector with its type's defaults.
func (e *connectorEntry) connector() Connector {
	c := e.c
	c.GuildIDs = slices.Clone(c.GuildIDs)
	if c.Type == ConnectorWebhook {
		return c
	}
	if _, ok := e.at["tls_verify"]; !ok {
		c.TLSVerify = true
	}
	if c.BaseURL == "" {
		c.BaseURL = defaultBaseURLs[c.Type]
	}
	if c.Trigger == "" {
		c.Trigger = TriggerMention
	}
	if c.Type == ConnectorSlack && c.Mode == "" {
		c.Mode = SlackSocket
	}
	return c
}
