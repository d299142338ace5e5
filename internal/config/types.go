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
	Scheduler     Scheduler
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
}

type ToolsSettings struct {
	Allow []string
	Deny  []string
}

type ContainerSettings struct {
	Enabled        *bool
	Image          string
	MemoryLimit    string
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
	// Isolation is the backend that runs this agent: "container" when
	// container_mode.enabled, "unrestricted" when file_access.unrestricted,
	// else "landlock".
	Isolation string
	// Timeout is container_mode.timeout_seconds, else [scheduler] default_timeout_seconds.
	Timeout time.Duration
}

type Container struct {
	Enabled     bool
	Image       string
	MemoryLimit string   // default "512m"
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

// Connector is one [[connectors]] entry.
type Connector struct {
	ID           string
	Type         string // "webhook"
	Secret       string // secret: never log
	SecretFile   string // alternative to Secret: file holding the secret
	ReplyURL     string
	DefaultAgent string
}

// Binding is one [[bindings]] entry: routes a connector's channel to an agent.
type Binding struct {
	Connector   string // empty matches every connector
	ChannelID   string // exact match
	ChannelName string // glob (path.Match syntax)
	Agent       string
}

// Scheduler is the [scheduler] table.
type Scheduler struct {
	MaxConcurrentRuns int           // default 4
	DefaultTimeout    time.Duration // default_timeout_seconds; default 300s
	RunAs             string        // unprivileged user for host runs; default "berth-agent"
	AgentBinary       string        // default /usr/libexec/berth/berth-agent
}
