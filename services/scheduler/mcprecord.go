package scheduler

import (
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/busapi"
)

// recordedMCP is the agent's account of its MCP servers as the run's record
// keeps it: valid UTF-8 without NUL, like every text of the record (the
// agent caps each error line; the servers are the admin's list).
func recordedMCP(servers []agentproto.MCPStatus) []agentproto.MCPStatus {
	if len(servers) == 0 {
		return nil
	}
	out := make([]agentproto.MCPStatus, len(servers))
	for i, s := range servers {
		out[i] = agentproto.MCPStatus{Name: cleanText(s.Name), Transport: cleanText(s.Transport), Error: cleanText(s.Error)}
		for _, tool := range s.Tools {
			out[i].Tools = append(out[i].Tools, cleanText(tool))
		}
	}
	return out
}

// mcpJSON is the run's MCP servers as GetRun returns them.
func mcpJSON(r Run) string {
	servers := make([]busapi.MCPStatus, len(r.MCP))
	for i, s := range r.MCP {
		servers[i] = busapi.MCPStatus(s)
	}
	return busapi.MCPWire(servers)
}
