package config

import "time"

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
	Scheduler     Scheduler
	Retention     Retention
	// ImageConfig is the global [image_config]; an agent's
	// [agents.image_config] overrides it key by key (see Agent.Image).
	ImageConfig ImageSettings
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
	Name      string
	Kind      string // "local", "openai", "anthropic"; defaults to Name when that is one of them
	APIKeyEnv string
	Model     string
	BaseURL   string
	MaxTokens int
	// Endpoints are the API paths under BaseURL that get the key through
	// the egress proxy; empty is the kind's (egresspolicy.DefaultEndpoints).
	Endpoints []string
	// APIVersion is anthropic-version for an anthropic provider.
	APIVersion string
	// Organization and Project are OpenAI-Organization and OpenAI-Project
	// for an openai provider: who pays is the admin's choice, never the
	// sandbox's.
	Organization string
	Project      string
}

// AgentSettings is [agent_defaults] or one [[agents]] entry, before resolution.
// Pointers and nil slices mean "not set here".
type AgentSettings struct {
	ID            string
	Name          string
	Workspace     string
	Provider      string
	Model         string
	MaxIterations *int
	Tools         ToolsSettings
	ContainerMode ContainerSettings
	FileAccess    FileAccessSettings
	// WorkspaceQuota is workspace_quota: "1g", "512m", "0" (no quota).
	WorkspaceQuota *Bytes
	ImageConfig    ImageSettings // [agents.image_config]; never set in [agent_defaults]
	Egress         EgressSettings
}

// EgressSecret is one [[egress.secrets]] entry. The value comes from the
// scheduler's environment (Env) or a file (File: absolute, or relative to
// $CREDENTIALS_DIRECTORY); it never enters a sandbox.
type EgressSecret struct {
	Name   string
	Env    string
	File   string
	Hosts  []string // exact host names
	Header string   // default "Authorization"
	Format string   // "{}" is replaced by the value; default "Bearer {}"
	// Ports, Methods and Paths narrow where the secret is added (any, when
	// empty): a tunnel to another port is not intercepted; a request with
	// another method, or a path not under one of Paths (prefixes at a
	// segment boundary), is sent without the secret.
	Ports   []int
	Methods []string
	Paths   []string
}

// EgressSettings is [agents.egress] (or [agent_defaults.egress]).
type EgressSettings struct {
	// Allow are rules "[METHOD[,METHOD…] ]host[:port]", parsed by
	// egresspolicy.ParseRule.
	Allow []string
}

// ImageSettings is [image_config] or [agents.image_config], before
// resolution. Nil means "not set here".
type ImageSettings struct {
	Enabled   *bool
	Image     string
	BaseImage string
	Packages  []string
	EnvVars   map[string]string
}

type ToolsSettings struct {
	Allow []string
	Deny  []string
}

type ContainerSettings struct {
	Enabled        *bool
	Image          string
	MemoryLimit    *Bytes
	TimeoutSeconds *int
	Network        string
	Runtime        string
	Warm           *int
	Binds          []string
	SecurityOpt    []string
}

type FileAccessSettings struct {
	Unrestricted      *bool
	AllowRead         []string
	AllowReadWrite    []string
	Deny              []string
	AllowHomeDotfiles *bool
	AllowNetwork      *bool
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
}

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
	Binds       []string // extra "SRC:DST[:ro|rw]" binds, checked by CheckBind
	SecurityOpt []string // extra security options, checked by CheckSecurityOpt
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
	Listen string
	// DefaultAgent receives messages no binding and no connector default routes.
	DefaultAgent string
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
type Connector struct {
	ID           string
	Type         string // "webhook", "meepachat", "discord" or "slack"
	Secret       string // webhook only; secret: never log
	SecretFile   string // webhook only; alternative to Secret: file holding the secret
	ReplyURL     string // webhook only
	DefaultAgent string

	// BaseURL is the platform's API. Defaults: discord
	// "https://discord.com/api/v10", slack "https://slack.com/api/";
	// required for meepachat (self-hosted).
	BaseURL string
	// GatewayURL overrides the WebSocket gateway (discord, meepachat).
	GatewayURL string
	TLSVerify  bool   // default true
	CAFile     string // PEM bundle trusted in addition to the system's; exists when set

	// Credential references (never the secrets themselves): "$VAR" reads the
	// service's environment, a bare name reads $CREDENTIALS_DIRECTORY/name
	// (systemd LoadCredential=), an absolute path is read as is. Resolve
	// them with Credential.
	Token         string // meepachat, discord
	AppToken      string // slack, socket mode
	BotToken      string // slack
	SigningSecret string // slack, events mode

	PublicKey     string   // discord application public key, hex (not a secret)
	ApplicationID string   // discord
	GuildIDs      []string // discord: only these guilds; empty means all
	AllowBots     bool     // handle messages of other bots; default false
	Trigger       string   // TriggerMention (default) or TriggerAll; not webhook
	Mode          string   // slack: SlackSocket (default) or SlackEvents
}

// Binding is one [[bindings]] entry: routes a connector's channel to an agent.
type Binding struct {
	Connector   string // empty matches every connector
	ChannelID   string // exact match
	ChannelName string // glob (path.Match syntax)
	ServerID    string // exact match: MeepaChat server, Discord guild, Slack team
	Agent       string
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
}

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
