package busapi

import (
	"encoding/json"
	"fmt"
	"time"
)

// EgressDecision is one request a run's egress proxy decided, as a run's
// record keeps it (Run.Egress).
type EgressDecision struct {
	Time   time.Time `json:"time"`
	Method string    `json:"method"`
	Host   string    `json:"host"`
	Port   int       `json:"port"`
	Path   string    `json:"path,omitempty"`
	// Ref is the ref a git push would update (one decision per ref).
	Ref     string `json:"ref,omitempty"`
	Allowed bool   `json:"allowed"`
	// Rule is the rule or provider that allowed it; Reason why it was refused.
	Rule      string `json:"rule,omitempty"`
	Reason    string `json:"reason,omitempty"`
	BytesUp   int64  `json:"bytes_up"`
	BytesDown int64  `json:"bytes_down"`
}

// EgressCounts counts every egress decision of a run (Run.EgressCounts):
// the record keeps only some decisions, the counts hold them all.
type EgressCounts struct {
	Allowed int `json:"allowed"`
	Refused int `json:"refused"`
	// Hosts are the hosts with the most requests, most first; OtherHosts
	// counts the requests to the hosts after them.
	Hosts      []EgressHostCount `json:"hosts,omitempty"`
	OtherHosts EgressHostCount   `json:"other_hosts"`
	// BytesUp and BytesDown add up the bytes of every request.
	BytesUp   int64 `json:"bytes_up,omitempty"`
	BytesDown int64 `json:"bytes_down,omitempty"`
}

// EgressHostCount is how many requests to one host were allowed and refused.
type EgressHostCount struct {
	Host    string `json:"host,omitempty"`
	Allowed int    `json:"allowed"`
	Refused int    `json:"refused"`
}

// ToolCall is one tool the run's agent called (Run.ToolCalls).
type ToolCall struct {
	Name   string          `json:"name"`
	Args   json.RawMessage `json:"args,omitempty"`
	Output string          `json:"output,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// MCPStatus is how one of the agent's MCP servers fared in a run (Run.MCP):
// the tools the model was offered, or why it gave none.
type MCPStatus struct {
	Name      string   `json:"name"`
	Transport string   `json:"transport"` // "stdio" or "http"
	Tools     []string `json:"tools,omitempty"`
	Error     string   `json:"error,omitempty"`
}

// MCPWire is a run's MCP servers as GetRun returns them: a JSON array,
// "[]" for none.
func MCPWire(servers []MCPStatus) string {
	if len(servers) == 0 {
		return "[]"
	}
	return jsonWire(servers)
}

// MCPServers decodes r.MCP; a cut or empty text is none.
func (r Run) MCPServers() ([]MCPStatus, error) {
	var servers []MCPStatus
	return servers, decodeOutput("mcp", r.MCP, &servers)
}

// EgressWire is a run's egress decisions as GetRun returns them: a JSON
// array, "[]" when the run made none.
func EgressWire(decisions []EgressDecision) string {
	if len(decisions) == 0 {
		return "[]"
	}
	return jsonWire(decisions)
}

// Wire is c as GetRun returns it: a JSON object, "{}" for none (a run that
// made no request, or ran before runs were counted).
func (c *EgressCounts) Wire() string {
	if c == nil {
		return "{}"
	}
	return jsonWire(c)
}

// EgressDecisions decodes r.Egress; a cut or empty text is none.
func (r Run) EgressDecisions() ([]EgressDecision, error) {
	var ds []EgressDecision
	return ds, decodeOutput("egress", r.Egress, &ds)
}

// EgressTally decodes r.EgressCounts; a cut or empty text counts nothing.
func (r Run) EgressTally() (EgressCounts, error) {
	var c EgressCounts
	return c, decodeOutput("egress_counts", r.EgressCounts, &c)
}

// Calls decodes r.ToolCalls; a cut or empty text is none.
func (r Run) Calls() ([]ToolCall, error) {
	var calls []ToolCall
	return calls, decodeOutput("tool_calls", r.ToolCalls, &calls)
}

func decodeOutput(key string, o Output, dst any) error {
	if o.Cut || o.Text == "" {
		return nil
	}
	if err := json.Unmarshal([]byte(o.Text), dst); err != nil {
		return fmt.Errorf("%w: %s is not its JSON: %v", ErrInvalid, key, err)
	}
	return nil
}
