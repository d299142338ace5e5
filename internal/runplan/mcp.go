package runplan

import (
	"fmt"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
)

// MCPServers are the agent's [[agents.mcp]] as its run's request carries
// them. No header travels: an HTTP server's headers_secret is one of the
// run's egress secrets (egressSecrets), which the proxy adds on the way
// out, since config made sure an allow rule reaches the server's host.
func MCPServers(a config.Agent) []agentproto.MCPServer {
	var out []agentproto.MCPServer
	for _, m := range a.MCP {
		s := agentproto.MCPServer{Name: m.Name, Command: m.Command, URL: m.URL, Tools: m.Tools}
		if m.Timeout != nil {
			// Rounded up: a server given 1.5s is not cut at 1s.
			s.TimeoutSeconds = int((time.Duration(*m.Timeout) + time.Second - 1) / time.Second)
		}
		out = append(out, s)
	}
	return out
}

// WebSearch is the agent's [agents.web_search] as its run's request
// carries it; nil gives the run no web_search tool.
func WebSearch(a config.Agent) *agentproto.WebSearch {
	if a.WebSearch == nil {
		return nil
	}
	return &agentproto.WebSearch{Kind: a.WebSearch.Provider, BaseURL: a.WebSearch.BaseURL}
}

// agentToolsWhy says, for sandbox explain, how each MCP server and the web
// search are reached: one line per server.
func agentToolsWhy(c *compiled, a config.Agent) {
	var lines []string
	for _, m := range a.MCP {
		line := m.Name + ": "
		if m.URL == "" {
			line += fmt.Sprintf("stdio, %s started inside the sandbox under the tools' confinement", strings.Join(m.Command, " "))
		} else {
			line += fmt.Sprintf("streamable HTTP to %s through the egress proxy", m.URL)
			if m.HeadersSecret != "" {
				line += fmt.Sprintf(", which adds the header from secret %s (never inside the sandbox)", m.HeadersSecret)
			}
		}
		if len(m.Tools) > 0 {
			line += "; tools: " + strings.Join(m.Tools, ", ")
		} else {
			line += "; tools: every one the server lists"
		}
		if m.Timeout != nil {
			line += fmt.Sprintf("; timeout %s", m.Timeout)
		}
		lines = append(lines, line)
	}
	if len(lines) > 0 {
		c.why["mcp"] = strings.Join(lines, "\n")
	}
	if ws := a.WebSearch; ws != nil {
		why := fmt.Sprintf("web_search through the egress proxy: %s at %s", ws.Provider, ws.BaseURL)
		if ws.Secret != "" {
			why += fmt.Sprintf(", its key added by the proxy from secret %s", ws.Secret)
		}
		c.why["web_search"] = why
	}
}
