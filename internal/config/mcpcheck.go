package config

import (
	"errors"
	"fmt"
)

// CheckMCPServer checks an MCP server that comes from outside berth.toml
// (an agent workspace's .mcp.json) as an [[agents.mcp]] entry's keys are
// checked: its name, exactly one of command and url, a URL berth-agent
// takes and that holds no credentials, its tool names and no
// headers_secret (a workspace names no secret of the admin's).
func CheckMCPServer(s MCPServer) error {
	if msg := checkMCPName(s.Name); msg != "" {
		return errors.New(msg)
	}
	if (len(s.Command) > 0) == (s.URL != "") {
		return errors.New("set exactly one of command (a stdio server, started inside the sandbox) and url (streamable HTTP, through the egress proxy)")
	}
	if len(s.Command) > 0 && s.Command[0] == "" {
		return errors.New("name the program to run, and its arguments")
	}
	if s.URL != "" {
		if msg := checkMCPURL(s.URL); msg != "" {
			return fmt.Errorf("url: %s", msg)
		}
	}
	for _, tool := range s.Tools {
		if msg := checkMCPTool(tool); msg != "" {
			return fmt.Errorf("tools: %s", msg)
		}
	}
	if s.HeadersSecret != "" {
		return errors.New("headers_secret is berth.toml's only")
	}
	return nil
}
