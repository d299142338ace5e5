package runplan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/isolation"
)

// WorkspaceMCPFile is MeepaGateway's list of MCP servers, which berth reads
// from the agent's workspace as a convenience besides [[agents.mcp]].
const WorkspaceMCPFile = ".mcp.json"

// maxWorkspaceMCPBytes caps the file: the sandbox writes it, the scheduler
// reads it.
const maxWorkspaceMCPBytes = 64 << 10

// maxWorkspaceMCPServers caps its servers: 64 KiB holds thousands, each a
// process in every later run (or a line in every later run record).
const maxWorkspaceMCPServers = 32

// RunMCP is the MCP servers of a run of agent a under plan: its
// [[agents.mcp]], then those of the workspace's .mcp.json that berth.toml
// does not name. It is read by the scheduler before each run, through
// os.Root (no symbolic link leads out of the workspace) and capped. An
// entry refused, or the file, gives a status line for the run record
// (agentproto.MCPStatus with Error) instead of a server; nothing refused
// reaches the sandbox.
func RunMCP(a config.Agent, plan isolation.Plan) (servers []agentproto.MCPServer, refused []agentproto.MCPStatus) {
	servers = MCPServers(a)
	entries, err := readWorkspaceMCP(plan.Workspace)
	if err != nil {
		return servers, []agentproto.MCPStatus{{Name: WorkspaceMCPFile, Error: err.Error()}}
	}
	for _, e := range entries {
		transport := "stdio"
		if e.URL != "" || e.Type == "http" || e.Type == "streamable-http" {
			transport = "http"
		}
		refuse := func(format string, args ...any) {
			refused = append(refused, agentproto.MCPStatus{Name: e.name, Transport: transport,
				Error: fmt.Sprintf("%s server %q refused: ", WorkspaceMCPFile, e.name) + fmt.Sprintf(format, args...)})
		}
		if slices.ContainsFunc(servers, func(s agentproto.MCPServer) bool { return s.Name == e.name }) {
			continue // berth.toml's entry of that name wins
		}
		if len(e.Headers) > 0 {
			// The sandbox can write the file: a header value from it could
			// carry anything, and headers are the proxy's, from [[egress.secrets]].
			refuse("headers are never taken from the workspace; put the value in an [[egress.secrets]] entry and the server in [[agents.mcp]] with headers_secret")
			continue
		}
		if len(e.Env) > 0 {
			refuse("env is not supported; set what the server needs in its command or args")
			continue
		}
		if e.Type != "" && e.Type != "stdio" && e.Type != "http" && e.Type != "streamable-http" {
			refuse("type %q is not one berth speaks (stdio, http)", e.Type)
			continue
		}
		m := config.MCPServer{Name: e.name, URL: e.URL}
		if e.Command != "" {
			m.Command = append([]string{e.Command}, e.Args...)
		}
		if err := config.CheckMCPServer(m); err != nil {
			refuse("%v", err)
			continue
		}
		if m.URL != "" {
			if why := reachesThroughProxy(plan, m.URL); why != "" {
				refuse("%s", why)
				continue
			}
		}
		// From the workspace: reached on the tools' channel (ADR 26).
		servers = append(servers, agentproto.MCPServer{Name: m.Name, Command: m.Command, URL: m.URL, Workspace: true})
	}
	return servers, refused
}

// workspaceMCPEntry is one server of .mcp.json, as MeepaGateway writes it.
type workspaceMCPEntry struct {
	name    string
	Type    string            `json:"type"`
	Command string            `json:"command"`
	Args    []string          `json:"args"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	Env     map[string]string `json:"env"`
}

// readWorkspaceMCP reads the workspace's .mcp.json, its servers in name
// order; none when there is no file.
func readWorkspaceMCP(workspace string) ([]workspaceMCPEntry, error) {
	if workspace == "" {
		return nil, nil
	}
	root, err := os.OpenRoot(workspace)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot open the workspace to read %s: %w", WorkspaceMCPFile, err)
	}
	defer root.Close()
	// Non-blocking: a FIFO the sandbox put there must not hang the scheduler.
	f, err := root.OpenFile(WorkspaceMCPFile, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", WorkspaceMCPFile, err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("cannot read %s: it is not a regular file", WorkspaceMCPFile)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxWorkspaceMCPBytes+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", WorkspaceMCPFile, err)
	}
	if len(data) > maxWorkspaceMCPBytes {
		return nil, fmt.Errorf("cannot read %s: it is larger than %d KiB", WorkspaceMCPFile, maxWorkspaceMCPBytes>>10)
	}
	var doc struct {
		Servers map[string]json.RawMessage `json:"mcpServers"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", WorkspaceMCPFile, err)
	}
	if len(doc.Servers) > maxWorkspaceMCPServers {
		return nil, fmt.Errorf("cannot read %s: it names %d servers, more than the %d berth takes from a workspace", WorkspaceMCPFile, len(doc.Servers), maxWorkspaceMCPServers)
	}
	names := make([]string, 0, len(doc.Servers))
	for name := range doc.Servers {
		names = append(names, name)
	}
	slices.Sort(names)
	var out []workspaceMCPEntry
	for _, name := range names {
		e := workspaceMCPEntry{name: name}
		if err := json.NewDecoder(bytes.NewReader(doc.Servers[name])).Decode(&e); err != nil {
			return nil, fmt.Errorf("cannot read %s: server %q: %w", WorkspaceMCPFile, name, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// reachesThroughProxy is why a run under plan cannot reach an HTTP MCP
// server at raw through its egress proxy, or "": as for [[agents.mcp]],
// only the admin's allow rules let it pass.
func reachesThroughProxy(plan isolation.Plan, raw string) string {
	if plan.Egress == nil {
		return "the run has no egress proxy to reach it through"
	}
	u, _ := url.Parse(raw)
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		port = 443
		if u.Scheme == "http" {
			port = 80
		}
	}
	method := "POST"
	if u.Scheme == "https" {
		method = "CONNECT"
	}
	host := egresspolicy.NormalHost(u.Hostname())
	for _, r := range plan.Egress.Allow {
		// A rule of berth-agent's own tools is no rule for the workspace's.
		if r.AgentTool == "" && r.Matches(method, host, port) {
			return ""
		}
	}
	hp := net.JoinHostPort(host, strconv.Itoa(port))
	return fmt.Sprintf("no [agents.egress] allow rule lets it reach %s (the admin adds %q to allow)", hp, strings.ToLower(hp))
}
