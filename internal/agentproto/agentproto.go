// Package agentproto defines the one request berth-agent reads on stdin and the
// one response it writes on stdout. It is the only contract between the
// scheduler (which builds the request) and the agent (which runs inside a
// sandbox), so it carries a version and nothing host-specific.
//
// Secrets travel only in the request: a provider key only for runs with a
// direct network (otherwise the egress proxy holds it and Provider.Key is
// empty), the run's egress token; never in the environment, argv, labels or
// files.
package agentproto

import (
	"encoding/json"
	"time"
)

// Version is the protocol version this build speaks.
const Version = 1

// Exit codes of berth-agent. A response is written on stdout for every code
// except ExitBadRequest (which may not know the run id) and ExitConfinement
// (which must not proceed to write anything else than its reason on stderr).
const (
	ExitOK          = 0 // response written; Response.Error is empty
	ExitAgentError  = 1 // response written; Response.Error says what failed (provider, max iterations, ...)
	ExitBadRequest  = 2 // stdin was not a valid request of a supported version
	ExitConfinement = 3 // the sandbox policy could not be enforced; nothing ran (fail closed)
	ExitInternal    = 4 // unexpected failure inside berth-agent
)

// LogResponseFollows is the message of berth-agent's last log line on
// stderr, written right before its response on stdout. Stdout and stderr
// reach the supervisor apart (a container's are copied separately by the
// engine), so this line is how it knows the log is complete and may answer
// the run before the sandbox is seen to exit.
const LogResponseFollows = "response follows"

// Request is what berth-agent reads on stdin.
type Request struct {
	Version   int        `json:"version"`
	RunID     string     `json:"run_id"`
	Agent     Agent      `json:"agent"`
	Message   Message    `json:"message"`
	Provider  Provider   `json:"provider"`
	Fallback  []Provider `json:"fallback,omitempty"`
	Policy    Policy     `json:"policy"`
	Workspace string     `json:"workspace"` // absolute path of the workspace as the agent sees it
	History   []Turn     `json:"history,omitempty"`
	// Egress is the run's way out when it has no network of its own: the
	// agent serves an HTTP proxy on ProxyAddr (loopback) for its provider
	// calls and its tools, forwarding to Socket with Token. Providers then
	// carry no key.
	Egress *Egress `json:"egress,omitempty"`
	// Rlimits are resource limits the agent sets on itself, soft and hard
	// (so they cannot be raised again), before it does anything of the run:
	// a host run's rlimits without systemd. An agent that cannot set one
	// exits with ExitConfinement.
	Rlimits []Rlimit `json:"rlimits,omitempty"`
	// Probe asks for no conversation: the agent calls Provider and each of
	// Fallback once, with a minimal message, through the path a run's calls
	// take (its egress proxy adds the keys), and answers Response.Probes.
	// So berthctl providers test proves what runs reach, and the scheduler
	// links no model SDK.
	Probe bool `json:"probe,omitempty"`
	// ProbeMCP asks for no conversation either: the agent starts its MCP
	// servers as a run would, answers Response.MCP (each server's tools, or
	// why it gave none) and calls no model (berthctl sandbox explain --probe).
	ProbeMCP bool `json:"probe_mcp,omitempty"`
	// MCP are the agent's MCP servers; their tools join the run's tool set.
	// No header value travels here: the egress proxy adds an HTTP server's
	// headers as an egress secret, so the sandbox never holds them.
	MCP []MCPServer `json:"mcp,omitempty"`
	// WebSearch, when set, gives the run the web_search tool.
	WebSearch *WebSearch `json:"web_search,omitempty"`
}

// MCPServer is one MCP server of the agent, reached over stdio (Command,
// started inside the sandbox like a tool) or streamable HTTP (URL, through
// the egress proxy); exactly one of the two is set.
type MCPServer struct {
	// Name makes the server's tools mcp__<Name>__<tool>.
	Name    string   `json:"name"`
	Command []string `json:"command,omitempty"`
	URL     string   `json:"url,omitempty"`
	// Tools, when set, are the server's tools (bare names) the agent may
	// call; the others are left out.
	Tools []string `json:"tools,omitempty"`
	// TimeoutSeconds bounds the server's start (initialize and tool list)
	// and each call to it; 0 means the agent's default.
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
	// Workspace marks a server of the workspace's .mcp.json: the sandbox
	// wrote it, so berth-agent reaches it on the tools' channel, never its own.
	Workspace bool `json:"workspace,omitempty"`
}

// WebSearch is the web_search tool's provider: Kind "searxng" (a SearXNG
// instance's JSON API) or "brave" (the Brave Search API, whose key the
// egress proxy adds as an egress secret), at BaseURL.
type WebSearch struct {
	Kind    string `json:"kind"`
	BaseURL string `json:"base_url"`
}

// ProbeResult is what one provider's probe call learned.
type ProbeResult struct {
	Provider string `json:"provider"`
	// Verdict is "ok", "unreachable", "auth failed", "model not found" or "error".
	Verdict   string `json:"verdict"`
	LatencyMS int64  `json:"latency_ms"`
	// Detail is the reply's start or the error, never a key.
	Detail string `json:"detail,omitempty"`
}

// Rlimit is one resource limit: Name is the lower-case name after RLIMIT_
// ("core", "cpu", "data", "nproc"), Value applies to soft and hard limit.
type Rlimit struct {
	Name  string `json:"name"`
	Value uint64 `json:"value"`
}

// Egress is where a sandboxed agent reaches berth's egress proxy.
type Egress struct {
	// ProxyAddr is 127.0.0.1:<port> inside the sandbox's own network namespace.
	ProxyAddr string `json:"proxy_addr"`
	// Socket is the run's Unix socket as the sandbox sees it.
	Socket string `json:"socket"`
	// Token authenticates this run at the proxy (Proxy-Authorization:
	// Bearer); a secret, valid only while the run lasts.
	Token string `json:"token"`
	// CABundle, when set, is the CA bundle tools must trust (the system's
	// roots and the run's CA, which the proxy intercepts the hosts of
	// [[egress.secrets]] with): SSL_CERT_FILE and friends point to it.
	CABundle string `json:"ca_bundle,omitempty"`
	// AgentToken opens berth-agent's own channel at the proxy (web_search,
	// berth.toml's MCP servers; docs/adr/0026-agent-own-egress-channel.md):
	// a secret berth-agent keeps in memory and never hands a tool.
	AgentToken string `json:"agent_token,omitempty"`
}

// Agent is the agent's effective settings for this run.
type Agent struct {
	ID            string            `json:"id"`
	Name          string            `json:"name,omitempty"`
	MaxIterations int               `json:"max_iterations"`
	Tools         Tools             `json:"tools"`
	Settings      map[string]string `json:"settings,omitempty"`
}

// Tools filters the tool set: an empty Allow allows every tool; Deny always
// wins. Ask are the [agents.tools] ask rules (egresspolicy.ParseToolRule):
// berth-agent asks its run's egress proxy before a call one matches.
type Tools struct {
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
	Ask   []string `json:"ask,omitempty"`
}

// BuiltinTools are the names of berth-agent's own tools (agent/tools holds
// them to this list), which [agents.tools] ask may name; MCP servers' tools
// are mcp__<server>__<tool>.
var BuiltinTools = []string{"shell", "read_file", "write_file", "list_dir", "web_fetch",
	"memory_store", "memory_search", "memory_delete", "memory_note", "memory_read",
	"soul_read", "soul_edit", "send_file", "web_search"}

// Message is the chat message that started the run.
type Message struct {
	ID          string    `json:"id"`
	Connector   string    `json:"connector"`
	Channel     string    `json:"channel"`
	ChannelName string    `json:"channel_name,omitempty"`
	Thread      string    `json:"thread,omitempty"`
	Author      string    `json:"author"`
	Text        string    `json:"text"`
	ReceivedAt  time.Time `json:"received_at"`
	// Files are the message's attachments, placed read-only in the
	// workspace before the run; the agent's prompt lists them.
	Files []MessageFile `json:"files,omitempty"`
}

// MessageFile is one attachment of a message.
type MessageFile struct {
	// Path is where the agent finds it (absolute, inside the workspace).
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type,omitempty"`
	Size int64  `json:"size"`
}

// Provider says which model to call and how. Kind is "local", "openai" or "anthropic".
type Provider struct {
	Name      string `json:"name"`
	Kind      string `json:"kind"`
	BaseURL   string `json:"base_url,omitempty"`
	Model     string `json:"model,omitempty"`
	MaxTokens int    `json:"max_tokens,omitempty"`
	Key       string `json:"key,omitempty"` // secret: never log, never pass on
	// Proxied says BaseURL is the in-sandbox egress proxy (Request.Egress),
	// which adds the key: Key is empty. Endpoint is then the provider's
	// configured base_url ("" means the kind's official endpoint), for the
	// agent to know which API dialect it talks; it never connects there.
	Proxied  bool   `json:"proxied,omitempty"`
	Endpoint string `json:"endpoint,omitempty"`
}

// Policy is the confinement berth-agent applies to itself before it opens a
// file or starts a tool. The scheduler computes it completely (workspace,
// system read set, configured paths); the agent adds nothing of its own.
type Policy struct {
	// Unrestricted skips Landlock entirely. Only set when the admin configured it.
	Unrestricted bool `json:"unrestricted,omitempty"`
	// AllowRead and AllowReadWrite are absolute paths; Deny beats AllowReadWrite beats AllowRead.
	AllowRead      []string `json:"allow_read,omitempty"`
	AllowReadWrite []string `json:"allow_read_write,omitempty"`
	Deny           []string `json:"deny,omitempty"`
	// Network allows TCP bind/connect. When false, Landlock denies TCP and the
	// runner puts the process in an empty network namespace.
	Network bool `json:"network"`
	// ConnectPorts lists TCP ports the agent may connect to even when Network is
	// false (the provider's port).
	ConnectPorts []uint16 `json:"connect_ports,omitempty"`
}

// Turn is one earlier exchange of the same conversation.
type Turn struct {
	Role string `json:"role"` // "user" or "assistant"
	Text string `json:"text"`
}

// Response is what berth-agent writes on stdout.
type Response struct {
	Version   int        `json:"version"`
	RunID     string     `json:"run_id"`
	Reply     string     `json:"reply"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	Usage     Usage      `json:"usage"`
	Error     string     `json:"error,omitempty"`
	// Probes answer a Request with Probe set, one per provider in order.
	Probes []ProbeResult `json:"probes,omitempty"`
	// MCP says how each of Request.MCP fared: its tools, or why it gave none.
	MCP []MCPStatus `json:"mcp,omitempty"`
	// OOMKills is how many processes of the agent's memory cgroup the
	// kernel OOM-killed while the run lasted (its oom_kill counter's rise):
	// the run hit its memory limit even when the engine never says so.
	OOMKills int `json:"oom_kills,omitempty"`
	// Spans are the run's span records (spans.go), SpansDropped how many
	// more there were than MaxSpans.
	Spans        []SpanRecord `json:"spans,omitempty"`
	SpansDropped int          `json:"spans_dropped,omitempty"`
	// Files are what the reply carries as uploads: the files the agent
	// sent with send_file and those it left in OutboxDir, at most
	// MaxOutFiles. The scheduler reads them from the workspace on the
	// host and trusts nothing here but the paths, which it opens beneath
	// the workspace without following a symlink.
	Files []OutFile `json:"files,omitempty"`
}

// OutFile is one file a reply carries.
type OutFile struct {
	// Path is the file's path relative to the workspace, slash-separated,
	// with no ".." element.
	Path string `json:"path"`
	// Caption is what the agent said with it ("" for a file in OutboxDir).
	Caption string `json:"caption,omitempty"`
}

// OutboxDir is the workspace directory whose files go out with the reply
// of the run that leaves them there; the scheduler removes them once it
// has them.
const OutboxDir = "outbox"

// MaxOutFiles is the most files one reply carries (busapi.MaxFiles).
const MaxOutFiles = 32

// MCPStatus is one MCP server in a run's record.
type MCPStatus struct {
	Name string `json:"name"`
	// Transport is "stdio" or "http".
	Transport string `json:"transport"`
	// Tools are the names the model was offered (mcp__<name>__<tool>).
	Tools []string `json:"tools,omitempty"`
	// Error says why the server gave no tools (it did not start, timed
	// out, answered garbage, or its entry is invalid).
	Error string `json:"error,omitempty"`
}

// ToolCall records one tool invocation of the run.
type ToolCall struct {
	Name   string          `json:"name"`
	Args   json.RawMessage `json:"args,omitempty"`
	Output string          `json:"output,omitempty"`
	Error  string          `json:"error,omitempty"`
	// Approval is how a call an [agents.tools] ask rule matched was
	// allowed ("approved by berthctl:root"); a denied one's Error says who
	// denied it.
	Approval string `json:"approval,omitempty"`
}

// Usage counts what the run consumed.
type Usage struct {
	Iterations   int `json:"iterations"`
	InputTokens  int `json:"input_tokens,omitempty"`
	OutputTokens int `json:"output_tokens,omitempty"`
}
