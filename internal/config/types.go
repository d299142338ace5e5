package config

import (
	"time"

	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/schedules"
)

// Config is the merged configuration: berth.toml plus its drop-ins.
type Config struct {
	Providers     Providers
	AgentDefaults AgentSettings
	Agents        []AgentSettings
	Intake        Intake
	Connectors    []Connector
	Bindings      []Binding
	// EgressSecrets are [[egress.secrets]]: credentials the egress proxy
	// adds on the way out, for their hosts only.
	EgressSecrets []EgressSecret
	// GitHubApps are [[egress.github_apps]]: apps whose installation tokens
	// the egress proxy mints per run for the agents' git rules.
	GitHubApps []GitHubApp
	Scheduler  Scheduler
	Retention  Retention
	// Tracing is [tracing]: OpenTelemetry traces, off by default.
	Tracing Tracing
	// Schedules are [[schedules]]: jobs that send an agent a prompt at
	// the times a calendar expression names.
	Schedules []schedules.Job
	// Approvers are [[approvers]]: who may decide an agent's approvals in
	// the chat (approvers.go).
	Approvers Approvers
	// ImageConfig is the global [image_config]; an agent's
	// [agents.image_config] overrides it key by key (see Agent.Image).
	ImageConfig ImageSettings
	// Kubernetes is [kubernetes]: the cluster of agents with backend =
	// "kubernetes" (kubernetes.go).
	Kubernetes Kubernetes
	// Sources lists the files that were read, in the order they were applied.
	Sources []string
}

// Providers is the [providers] table: primary, fallback and one sub-table per
// provider ([providers.NAME]).
type Providers struct {
	Primary  string
	Fallback []string
	Entries  map[string]Provider
}

// Provider is one [providers.NAME] table.
type Provider struct {
	Name      string `berth:"name"`
	Kind      string `toml:"kind" berth:"check=providerKind"` // "local", "openai", "anthropic"; defaults to Name when that is one of them
	APIKeyEnv string `toml:"api_key_env" berth:"check=envName"`
	Model     string `toml:"model"`
	BaseURL   string `toml:"base_url" berth:"check=httpURL"`
	MaxTokens int    `toml:"max_tokens" berth:"check=atLeastOne"`
	// Endpoints are the API paths under BaseURL that get the key through
	// the egress proxy; empty is the kind's (egresspolicy.DefaultEndpoints).
	Endpoints []string `toml:"endpoints" berth:"check=endpoint"`
	// APIVersion is anthropic-version for an anthropic provider.
	APIVersion string `toml:"api_version" berth:"check=apiVersion"`
	// Organization and Project are OpenAI-Organization and OpenAI-Project
	// for an openai provider: who pays is the admin's choice, never the
	// sandbox's.
	Organization string `toml:"organization" berth:"check=openaiOrganization"`
	Project      string `toml:"project" berth:"check=openaiProject"`
	// Prices are [providers.NAME.prices], one table per model (usage.go).
	Prices ProviderPrices `toml:"prices"`
}

// AgentSettings is [agent_defaults] or one [[agents]] entry, before resolution.
// Pointers and nil slices mean "not set here".
type AgentSettings struct {
	ID            string             `toml:"id" berth:"check=id"`
	Name          string             `toml:"name"`
	Workspace     string             `toml:"workspace" berth:"check=absolutePath"`
	Provider      string             `toml:"provider"`
	Model         string             `toml:"model"`
	MaxIterations *int               `toml:"max_iterations" berth:"check=maxIterations"`
	Tools         ToolsSettings      `toml:"tools"`
	ContainerMode ContainerSettings  `toml:"container_mode"`
	FileAccess    FileAccessSettings `toml:"file_access"`
	// WorkspaceQuota is workspace_quota: "1g", "512m", "0" (no quota).
	WorkspaceQuota *Bytes          `toml:"workspace_quota" berth:"check=workspaceQuota"`
	ImageConfig    ImageSettings   `toml:"image_config"` // [agents.image_config]; never set in [agent_defaults]
	Egress         EgressSettings  `toml:"egress"`
	Sandbox        SandboxSettings `toml:"sandbox"`
	// MCP are [[agents.mcp]]; an agent's list replaces [agent_defaults]'s.
	MCP       []MCPServer       `toml:"mcp"`
	WebSearch WebSearchSettings `toml:"web_search"`
	// Budget is [agents.budget] (usage.go).
	Budget BudgetSettings `toml:"budget"`

	// Backend is "local" (default) or "kubernetes" (kubernetes.go).
	Backend string `toml:"backend" berth:"check=backend"`
}

// SandboxSettings is [agents.sandbox] (or [agent_defaults.sandbox]): whether
// a conversation keeps its sandbox between messages, and for how long.
type SandboxSettings struct {
	Scope       string    `toml:"scope" berth:"check=sandboxScope"`
	IdleStop    *Duration `toml:"idle_stop" berth:"check=sandboxDuration"`
	MaxLifetime *Duration `toml:"max_lifetime" berth:"check=sandboxDuration"`
	MaxPerAgent *int      `toml:"max_per_agent" berth:"check=atLeastOne"`
}

// EgressSecret is one [[egress.secrets]] entry. The value comes from the
// scheduler's environment (Env) or a file (File: absolute, or relative to
// $CREDENTIALS_DIRECTORY); it never enters a sandbox.
type EgressSecret struct {
	Name   string   `toml:"name" berth:"check=nonEmpty"`
	Env    string   `toml:"env" berth:"check=nonEmpty"`
	File   string   `toml:"file" berth:"check=nonEmpty"`
	Hosts  []string `toml:"hosts" berth:"check=host"`          // exact host names
	Header string   `toml:"header" berth:"check=headerName"`   // default "Authorization"
	Format string   `toml:"format" berth:"check=secretFormat"` // "{}" is replaced by the value; default "Bearer {}"
	// Ports, Methods and Paths narrow where the secret is added (any, when
	// empty): a tunnel to another port is not intercepted; a request with
	// another method, or a path not under one of Paths (prefixes at a
	// segment boundary), is sent without the secret.
	Ports   []int    `toml:"ports" berth:"check=port"`
	Methods []string `toml:"methods" berth:"check=tunnelMethod"`
	Paths   []string `toml:"paths" berth:"check=secretPath"`
}

// EgressSettings is [agents.egress] (or [agent_defaults.egress]).
type EgressSettings struct {
	// Allow are rules "[METHOD[,METHOD…] ]host[:port]", parsed by
	// egresspolicy.ParseRule.
	Allow []string `toml:"allow" berth:"check=egressRule"`
	// Ask are rules written as Allow's: a request no allow rule allows but
	// one of these matches waits for a person's answer (the scheduler asks
	// in the conversation; berthctl approvals decides) instead of being
	// refused. Allow beats ask.
	Ask []string `toml:"ask" berth:"check=egressRule"`
	// ApprovalTimeout is how long such a request waits (10 min): then it is
	// refused.
	ApprovalTimeout *Duration `toml:"approval_timeout" berth:"check=approvalTimeout"`
	// Git are [[agents.egress.git]] (git.go); a list replaces the defaults' whole.
	Git []GitRule `toml:"git"`
	// Mode is "read-only" for an agent that may look but never change
	// anything (only GET and HEAD, no bodies); "" is the default.
	Mode string `toml:"mode" berth:"check=egressMode"`
}

// ImageSettings is [image_config] or [agents.image_config], before
// resolution. Nil means "not set here".
type ImageSettings struct {
	Enabled   *bool             `toml:"enabled"`
	Image     string            `toml:"image" berth:"check=imageRef"`
	BaseImage string            `toml:"base_image" berth:"check=imageRef"`
	Packages  []string          `toml:"packages" berth:"check=debianPackage"`
	EnvVars   map[string]string `toml:"env_vars"` // checked by checks.imageValues: names and values together
}

type ToolsSettings struct {
	Allow []string `toml:"allow" berth:"check=nonEmpty"`
	Deny  []string `toml:"deny" berth:"check=nonEmpty"`
	// Ask are tool calls a person decides before they run: a tool's name
	// ("shell": every call) or "shell: PATTERN" (egresspolicy.ParseToolRule),
	// asked through the run's egress proxy like [agents.egress] ask, within
	// its approval_timeout.
	Ask []string `toml:"ask" berth:"check=toolAsk"`
}

type ContainerSettings struct {
	Enabled        *bool       `toml:"enabled"`
	Image          string      `toml:"image"`
	MemoryLimit    *Bytes      `toml:"memory_limit" berth:"check=memoryLimit"`
	TimeoutSeconds *int        `toml:"timeout_seconds" berth:"check=seconds"`
	Network        NetworkMode `toml:"network"`
	Runtime        string      `toml:"runtime" berth:"check=runtime"`
	Warm           *int        `toml:"warm" berth:"check=warm"`
	Binds          []string    `toml:"binds" berth:"check=bind"`
	SecurityOpt    []string    `toml:"security_opt" berth:"check=securityOpt"`
}

type FileAccessSettings struct {
	Unrestricted      *bool    `toml:"unrestricted"`
	AllowRead         []string `toml:"allow_read" berth:"check=absolutePath"`
	AllowReadWrite    []string `toml:"allow_read_write" berth:"check=absolutePath"`
	Deny              []string `toml:"deny" berth:"check=absolutePath"`
	AllowHomeDotfiles *bool    `toml:"allow_home_dotfiles"`
	AllowNetwork      *bool    `toml:"allow_network"`
}

// Agent is one agent's effective settings: agent → agent_defaults → built-in default.
type Agent struct {
	ID            string
	Name          string
	Workspace     string // absolute; default <state>/agents/<id>, resolved by the scheduler when empty
	Provider      string // provider name; default Providers.Primary, else "local"
	Model         string // overrides the provider's model when set
	MaxIterations int    // default 10
	Tools         ToolsSettings
	Container     Container
	FileAccess    FileAccess
	// EgressAllow are the agent's egress rules: what its tools may reach
	// through berth's egress proxy when it has no direct network.
	EgressAllow []string
	// EgressAsk are the agent's [agents.egress] ask rules, held for a
	// person's answer for up to EgressApprovalTimeout (default 10 min).
	EgressAsk             []string
	EgressApprovalTimeout time.Duration
	// EgressGit are the agent's [[agents.egress.git]] rules, checked
	// against [[egress.secrets]] and [[egress.github_apps]] when loaded.
	EgressGit []GitRule
	// Isolation is the backend that runs this agent: "container" when
	// container_mode.enabled, "unrestricted" when file_access.unrestricted,
	// else "landlock".
	Isolation string
	// Timeout is container_mode.timeout_seconds, else [scheduler] default_timeout_seconds.
	Timeout time.Duration
	// Image is the container image the image service prepares for this
	// agent: [agents.image_config] → [image_config] → built-in default.
	Image ImageConfig
	// WorkspaceQuota is the most the agent's workspace may hold, in bytes
	// (workspace_quota; default 1 GiB). 0 means no quota, an admin's
	// explicit choice that sandbox explain shows.
	WorkspaceQuota Bytes
	// Sandbox is [agents.sandbox], defaults filled in.
	Sandbox Sandbox
	// MCP are the agent's MCP servers ([[agents.mcp]]), checked against
	// [[egress.secrets]] and the allow rules when loaded.
	MCP []MCPServer
	// WebSearch is [agents.web_search]; nil gives no web_search tool.
	WebSearch *WebSearch
	// Budget is [agents.budget]: what the agent may spend on its
	// providers, enforced by each run's egress proxy (0: no limit).
	Budget egresspolicy.Budget
	// EgressReadOnly is [agents.egress] mode = "read-only".
	EgressReadOnly bool
}

// Sandbox scopes: a fresh sandbox per message, or one per conversation
// (connector, channel, thread) kept between its messages.
const (
	SandboxScopeMessage      = "message"
	SandboxScopeConversation = "conversation"
)

// Sandbox is an agent's effective [agents.sandbox]. With scope "message"
// the other fields are the defaults and unused.
type Sandbox struct {
	Scope string
	// IdleStop stops a conversation's sandbox this long after its last
	// activity (a run, an egress request).
	IdleStop time.Duration
	// MaxLifetime stops it after the run under way once it is this old.
	MaxLifetime time.Duration
	// MaxPerAgent is how many of the agent's sandboxes may be alive at once.
	MaxPerAgent int
}

// Conversation tells whether each conversation keeps its sandbox.
func (s Sandbox) Conversation() bool { return s.Scope == SandboxScopeConversation }

// ImageConfig is an agent's effective image_config.
type ImageConfig struct {
	// Enabled: build (or use) this image for the agent's container runs.
	Enabled bool
	// Image is used as it is when set: no build, BaseImage and Packages
	// are not used.
	Image string
	// BaseImage is the Debian-family image packages are installed on;
	// default DefaultBaseImage.
	BaseImage string
	Packages  []string          // Debian package names
	EnvVars   map[string]string // baked into the image; never secrets
}

type Container struct {
	Enabled     bool
	Image       string
	MemoryLimit Bytes    // default DefaultMemoryLimit
	Network     string   // "bridge" (default) or "none"
	Runtime     string   // engine runtime (runc, runsc, ...); empty means the engine's default
	Warm        int      // containers kept started per agent, waiting for a request; default 0
	Binds       []string // extra "SRC:DST[:ro|rw]" binds, checked by checkBind
	SecurityOpt []string // extra security options, checked by checkSecurityOpt
}

type FileAccess struct {
	Unrestricted      bool
	AllowRead         []string
	AllowReadWrite    []string
	Deny              []string
	AllowHomeDotfiles bool
	AllowNetwork      bool // default false
}

// Intake is the [intake] table.
type Intake struct {
	// Listen is the HTTP address used when intake is not socket-activated and
	// no --listen flag is given. Empty means: no HTTP listener of its own.
	Listen string `toml:"listen" berth:"check=hostPort"`
	// DefaultAgent receives messages no binding and no connector default routes.
	DefaultAgent string `toml:"default_agent"`
	// MaxAttachmentBytes caps one file on an inbound message
	// (AttachmentLimit: default DefaultMaxAttachmentBytes);
	// MaxMessageAttachmentBytes caps a message's files together
	// (MessageAttachmentLimit: default DefaultMaxMessageAttachmentBytes). A
	// message over either gets a reply saying so and runs nothing.
	MaxAttachmentBytes        *Bytes `toml:"max_attachment_bytes" berth:"check=attachmentSize"`
	MaxMessageAttachmentBytes *Bytes `toml:"max_message_attachment_bytes" berth:"check=attachmentSize"`
	// RefusedAttachmentTypes are globs on a file's media type
	// ("application/x-msdownload", "video/*") or name ("*.exe"); a message
	// with a matching file gets a reply saying so and runs nothing.
	RefusedAttachmentTypes []string `toml:"refused_attachment_types" berth:"check=glob"`
}

// Defaults of the inbound attachment limits.
const (
	DefaultMaxAttachmentBytes        Bytes = 25 << 20
	DefaultMaxMessageAttachmentBytes Bytes = 100 << 20
)

// IntakeSettings is [intake].
func (c *Config) IntakeSettings() Intake { return c.Intake }

// AttachmentLimit is max_attachment_bytes or its default.
func (i Intake) AttachmentLimit() int64 {
	if i.MaxAttachmentBytes != nil {
		return int64(*i.MaxAttachmentBytes)
	}
	return int64(DefaultMaxAttachmentBytes)
}

// MessageAttachmentLimit is max_message_attachment_bytes or its default.
func (i Intake) MessageAttachmentLimit() int64 {
	if i.MaxMessageAttachmentBytes != nil {
		return int64(*i.MaxMessageAttachmentBytes)
	}
	return int64(DefaultMaxMessageAttachmentBytes)
}

// Connector types.
const (
	ConnectorWebhook   = "webhook"
	ConnectorMeepaChat = "meepachat"
	ConnectorDiscord   = "discord"
	ConnectorSlack     = "slack"
)

// Connector trigger values: when a channel message starts a run.
const (
	TriggerMention = "mention" // in channels only when the bot is mentioned; DMs always
	TriggerAll     = "all"     // every message the bot can see
)

// Slack connection modes.
const (
	SlackSocket = "socket" // Socket Mode: app_token + bot_token
	SlackEvents = "events" // Events API over HTTP: signing_secret + bot_token
)

// Credential keys of a connector, as written in the config and passed to
// Connector.Credential.
const (
	CredToken         = "token"          // meepachat "<bot_id>.<secret>", discord bot token
	CredAppToken      = "app_token"      // slack xapp- (socket mode)
	CredBotToken      = "bot_token"      // slack xoxb-
	CredSigningSecret = "signing_secret" // slack Events API
)

// Connector is one [[connectors]] entry.
//
// The order of the fields is the order in which a type's keys are listed
// when a connector sets a key of another type.
type Connector struct {
	ID           string `toml:"id" berth:"check=id"`
	Type         string `toml:"type" berth:"check=connectorType"` // "webhook", "meepachat", "discord" or "slack"
	DefaultAgent string `toml:"default_agent"`
	Secret       string `toml:"secret" berth:"check=nonEmpty,types=webhook"`          // secret: never log
	SecretFile   string `toml:"secret_file" berth:"check=absolutePath,types=webhook"` // alternative to Secret: file holding the secret
	ReplyURL     string `toml:"reply_url" berth:"check=httpURL,types=webhook"`

	// BaseURL is the platform's API. Defaults: discord
	// "https://discord.com/api/v10", slack "https://slack.com/api/";
	// required for meepachat (self-hosted).
	BaseURL string `toml:"base_url" berth:"check=httpURL,types=meepachat|discord|slack"`
	// GatewayURL overrides the WebSocket gateway (discord, meepachat).
	GatewayURL string `toml:"gateway_url" berth:"check=gatewayURL,types=meepachat|discord"`
	TLSVerify  bool   `toml:"tls_verify" berth:"types=meepachat|discord|slack"`           // default true
	CAFile     string `toml:"ca_file" berth:"check=caFile,types=meepachat|discord|slack"` // PEM bundle trusted in addition to the system's; exists when set

	// Credential references (never the secrets themselves): "$VAR" reads the
	// service's environment, a bare name reads $CREDENTIALS_DIRECTORY/name
	// (systemd LoadCredential=), an absolute path is read as is. Resolve
	// them with Credential.
	Token         string `toml:"token" berth:"check=credential,types=meepachat|discord"`
	AppToken      string `toml:"app_token" berth:"check=credential,types=slack"` // socket mode
	BotToken      string `toml:"bot_token" berth:"check=credential,types=slack"`
	SigningSecret string `toml:"signing_secret" berth:"check=credential,types=slack"` // events mode

	PublicKey     string   `toml:"public_key" berth:"check=ed25519PublicKey,types=discord"` // application public key, hex (not a secret)
	ApplicationID string   `toml:"application_id" berth:"check=snowflake,types=discord"`
	GuildIDs      []string `toml:"guild_ids" berth:"check=snowflake,types=discord"`             // only these guilds; empty means all
	AllowBots     bool     `toml:"allow_bots" berth:"types=meepachat|discord|slack"`            // handle messages of other bots; default false
	Trigger       string   `toml:"trigger" berth:"check=trigger,types=meepachat|discord|slack"` // TriggerMention (default) or TriggerAll
	Mode          string   `toml:"mode" berth:"check=slackMode,types=slack"`                    // SlackSocket (default) or SlackEvents

	// Progress and Reactions: how a run in progress shows (progress.go).
	Progress  string `toml:"progress" berth:"check=progress,types=meepachat|discord|slack"`
	Reactions bool   `toml:"reactions" berth:"types=meepachat|discord|slack"`
}

// Binding is one [[bindings]] entry: routes a connector's channel to an agent.
type Binding struct {
	Connector   string `toml:"connector"`                         // empty matches every connector
	ChannelID   string `toml:"channel_id" berth:"check=nonEmpty"` // exact match
	ChannelName string `toml:"channel_name" berth:"check=glob"`   // glob (path.Match syntax)
	ServerID    string `toml:"server_id" berth:"check=nonEmpty"`  // exact match: MeepaChat server, Discord guild, Slack team
	Agent       string `toml:"agent"`
}

// Scheduler is the [scheduler] table.
type Scheduler struct {
	MaxConcurrentRuns int           // default 4
	DefaultTimeout    time.Duration // default_timeout_seconds; default 300s
	RunAs             string        // unprivileged user for host runs; default "berth-agent"
	AgentBinary       string        // default /usr/libexec/berth/berth-agent
	// EgressBinary is the egress proxy; default berth-egress beside AgentBinary.
	EgressBinary string
	// EgressUser is the unprivileged user the egress proxy runs as; default
	// "berth-egress". Never the run user: the proxy holds the keys.
	EgressUser string
	// AgentUIDs is agent_uids: the range each agent's own uid (and gid) is
	// allocated from, so agents are separated by DAC and per-user limits
	// are per agent. Default DefaultAgentUIDs; "off" (Off true) runs every
	// agent as RunAs.
	AgentUIDs UIDRange
	// AllowRlimitFallback is allow_rlimit_fallback: where neither systemd
	// nor a writable cgroup can limit a host run's memory and processes as
	// a whole, run it with per-process rlimits instead of failing it.
	// Default false (fail closed).
	AllowRlimitFallback bool
	// RunsCPUWeight is runs_cpu_weight: the CPU weight (1–10000, systemd's
	// CPUWeight scale, 100 = one ordinary service) of all host runs
	// together — berth-runs.slice under systemd, else the berth-runs
	// cgroup — so that intake and the daemons get the CPU first when runs
	// want more than is free (ADR 30). Default DefaultRunsCPUWeight.
	RunsCPUWeight int
	// MaxReplyFileBytes is max_reply_file_bytes: the largest file a reply
	// carries (send_file, outbox/); a larger one is left out with a note in
	// the reply. Default DefaultMaxReplyFileBytes.
	MaxReplyFileBytes int64
	// MaxReplyFilesBytes is max_reply_files_bytes: all of one reply's files
	// together; the files past it are left out with a note. Default
	// DefaultMaxReplyFilesBytes.
	MaxReplyFilesBytes int64
}

// Defaults of the reply file caps: a file as large as Slack and MeepaChat
// take by default, and four of them.
const (
	DefaultMaxReplyFileBytes  = 25 << 20
	DefaultMaxReplyFilesBytes = 100 << 20
)

// DefaultRunsCPUWeight is the built-in runs_cpu_weight: a fifth of an
// ordinary service's weight (CPUWeight=100), as units/systemd/berth-runs.slice
// ships it.
const DefaultRunsCPUWeight = 20

// MaxRunsCPUWeight is the largest CPU weight, cgroup v2's and systemd's.
const MaxRunsCPUWeight = 10000

// UIDRange is an inclusive range of uids, written "FIRST-LAST".
type UIDRange struct {
	First, Last uint32
	Off         bool // agent_uids = "off": every agent runs as run_as
}

// DefaultAgentUIDs is the built-in agent_uids: 65536 ids from 0x70000000,
// above every range systemd allocates (its container ranges end at
// 1879048191) and below 2^31, so tools that keep uids in an int32 work.
var DefaultAgentUIDs = UIDRange{First: 1879048192, Last: 1879048192 + 65535}

// Retention is the [retention] table: how long finished work is kept. Every
// field has its default filled in when the table is absent.
type Retention struct {
	// FinishedRuns is finished_runs_days: a finished, delivered run older than
	// this is deleted. Default 30 days.
	FinishedRuns time.Duration
	// RunsPerAgent is runs_per_agent: at most this many finished runs are kept
	// per agent (the newest). Default 10000.
	RunsPerAgent int
	// Delivered is delivered_hours: intake keeps delivered or refused inbox and
	// outbox entries and their message ids this long, so a platform's retry of
	// an old event still runs nothing twice. Default 72 hours, at least 24.
	Delivered time.Duration
	// IdleConversation is idle_conversation_days: a conversation's history
	// with no new turn for this long is deleted. Default 30 days.
	IdleConversation time.Duration
}
