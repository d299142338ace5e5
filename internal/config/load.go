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
	defaultNetwork           = NetworkMode("bridge")
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

	// [agents.sandbox] (issue 22): a conversation's sandbox stops 15 minutes
	// after its last activity, lives a day at most, three per agent.
	defaultSandboxIdleStop    = Duration(15 * time.Minute)
	defaultSandboxMaxLifetime = Duration(24 * time.Hour)
	defaultSandboxMaxPerAgent = 3
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

// Defaults is the Config of a berth.toml that sets nothing: every built-in
// default and no agent. A Config made in code (a test's) starts from it, so
// that a default is declared only where a Config is resolved.
func Defaults() *Config { return newTree().config() }

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

// config builds the Config of a merged, valid tree: the one place where
// what no file set gets its built-in default.
func (t *tree) config() *Config {
	doc := &t.v
	sched := &doc.Scheduler
	c := &Config{
		Providers: Providers{
			Primary:  doc.Providers.Primary,
			Fallback: doc.Providers.Fallback,
			Entries:  map[string]Provider{localProvider: {Name: localProvider, Kind: "local"}},
		},
		AgentDefaults: doc.AgentDefaults.v,
		Intake:        doc.Intake,
		ImageConfig:   doc.ImageConfig,
		Scheduler: Scheduler{
			MaxConcurrentRuns:   firstSet(defaultMaxConcurrentRuns, sched.MaxConcurrentRuns),
			DefaultTimeout:      defaultTimeout,
			RunAs:               first(sched.RunAs, defaultRunAs),
			AgentBinary:         first(sched.AgentBinary, defaultAgentBinary),
			EgressUser:          first(sched.EgressUser, defaultEgressUser),
			AgentUIDs:           firstSet(DefaultAgentUIDs, sched.AgentUIDs),
			AllowRlimitFallback: sched.AllowRlimitFallback,
			RunsCPUWeight:       firstSet(DefaultRunsCPUWeight, sched.RunsCPUWeight),
			MaxReplyFileBytes:   int64(firstSet(Bytes(DefaultMaxReplyFileBytes), sched.MaxReplyFileBytes)),
			MaxReplyFilesBytes:  int64(firstSet(Bytes(DefaultMaxReplyFilesBytes), sched.MaxReplyFilesBytes)),
		},
		Retention: doc.Retention.resolve(),
		Tracing:   doc.Tracing,
		// [kubernetes] is kept as written: its methods default it.
		Kubernetes: doc.Kubernetes,
	}
	if sched.DefaultTimeoutSeconds != nil {
		c.Scheduler.DefaultTimeout = time.Duration(*sched.DefaultTimeoutSeconds) * time.Second
	}
	c.Scheduler.EgressBinary = first(sched.EgressBinary, filepath.Join(filepath.Dir(c.Scheduler.AgentBinary), "berth-egress"))
	for _, e := range doc.Providers.Entries {
		p := e.v
		if p.Kind == "" {
			p.Kind = p.Name // validated: the name is a kind
		}
		c.Providers.Entries[p.Name] = p
	}
	for _, a := range doc.Agents {
		c.Agents = append(c.Agents, a.v)
	}
	for _, e := range doc.Connectors {
		c.Connectors = append(c.Connectors, resolveConnector(e))
	}
	for _, b := range doc.Bindings {
		c.Bindings = append(c.Bindings, b.v)
	}
	for _, e := range doc.Egress.Secrets {
		s := e.v
		s.Header = first(s.Header, "Authorization")
		s.Format = first(s.Format, "Bearer {}")
		c.EgressSecrets = append(c.EgressSecrets, s)
	}
	c.GitHubApps = t.resolveGitHubApps()
	c.Approvers = t.resolveApprovers()
	for _, e := range doc.Schedules {
		c.Schedules = append(c.Schedules, resolveSchedule(e))
	}
	return c
}

// resolve returns [retention] with the default of every key not set.
func (r *retentionSettings) resolve() Retention {
	const day = 24 * time.Hour
	return Retention{
		FinishedRuns:     time.Duration(firstSet(defaultFinishedRunsDays, r.FinishedRunsDays)) * day,
		RunsPerAgent:     firstSet(defaultRunsPerAgent, r.RunsPerAgent),
		Delivered:        time.Duration(firstSet(defaultDeliveredHours, r.DeliveredHours)) * time.Hour,
		IdleConversation: time.Duration(firstSet(defaultIdleConversationDays, r.IdleConversationDays)) * day,
	}
}

// resolveConnector returns a merged, valid connector with its type's defaults.
func resolveConnector(e *entry[Connector]) Connector {
	c := e.v
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
	if c.Progress == "" {
		c.Progress = DefaultProgress(c.Type)
	}
	return c
}
