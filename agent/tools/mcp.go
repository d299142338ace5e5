package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berth-dev/berth/agent/provider"
	"github.com/berth-dev/berth/internal/agentproto"
)

// MCP limits.
const (
	// MCPDefaultTimeout bounds a server's start and each call to it when
	// its entry sets no timeout.
	MCPDefaultTimeout = 30 * time.Second
	MCPOutputLimit    = 64 << 10 // bytes of a call's result returned
	mcpStderrLimit    = 4 << 10  // bytes of a stdio server's stderr kept for errors
	mcpDescription    = 2 << 10  // bytes of a tool's description kept
	mcpMaxTools       = 128      // tools taken from one server
	mcpMaxSchema      = 32 << 10 // bytes of a tool's input schema
	mcpMaxError       = 1 << 10  // bytes of a server's error kept in the record
	// mcpStopGrace is how long a stdio server may take to exit once its
	// stdin is closed, before its process group is killed.
	mcpStopGrace = 500 * time.Millisecond
)

// MCPPrefix starts the name of every MCP tool: mcp__<server>__<tool>.
const MCPPrefix = "mcp__"

var (
	mcpServerName = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]|_[A-Za-z0-9-])*$`)
	// What both model APIs accept as a tool name.
	mcpToolName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
)

// MCPServers are a run's MCP servers, connected once at its start and
// closed (stdio servers killed) with Close when the run ends.
type MCPServers struct {
	servers []*mcpServer
}

type mcpServer struct {
	entry     agentproto.MCPServer
	transport string
	timeout   time.Duration
	session   *mcp.ClientSession
	proc      *stdioProcess // stdio only
	tools     []Tool
	err       error // why the server gave no tools
}

// ConnectMCP starts or reaches every server of entries at once, each
// within its timeout: a server that fails (bad entry, no start, no answer,
// garbage) gives no tools but an error in Status and, for the tools its
// entry names, tools that return that error to the model.
func ConnectMCP(ctx context.Context, env Env, entries []agentproto.MCPServer, log *slog.Logger) *MCPServers {
	m := &MCPServers{}
	seen := map[string]bool{}
	var wg sync.WaitGroup
	for _, e := range entries {
		s := &mcpServer{entry: e, transport: "stdio", timeout: MCPDefaultTimeout}
		if e.URL != "" {
			s.transport = "http"
		}
		if e.TimeoutSeconds > 0 {
			s.timeout = time.Duration(e.TimeoutSeconds) * time.Second
		}
		m.servers = append(m.servers, s)
		if err := checkMCPEntry(e, seen); err != nil {
			s.err = err
		} else {
			wg.Go(func() { s.connect(ctx, env, log) })
		}
		seen[e.Name] = true
	}
	wg.Wait()
	// A name the model API refuses, or one offered twice (a server
	// configured twice), would fail every model call of the run.
	offered := map[string]bool{}
	for _, s := range m.servers {
		for _, t := range s.tools {
			offered[t.Spec().Name] = true
		}
	}
	for _, s := range m.servers {
		if s.err != nil {
			log.Warn("MCP server gave no tools", "server", s.entry.Name, "transport", s.transport, "err", s.err.Error())
			s.tools = nil
			for _, name := range s.entry.Tools {
				full := mcpFullName(s.entry.Name, name)
				if !mcpServerName.MatchString(s.entry.Name) || !mcpToolName.MatchString(full) || offered[full] {
					continue
				}
				offered[full] = true
				s.tools = append(s.tools, mcpTool{server: s, name: name, spec: provider.Tool{
					Name:        full,
					Description: "Unavailable: " + s.err.Error(),
					Parameters:  schema(`{"type":"object"}`),
				}})
			}
			continue
		}
		log.Info("MCP server connected", "server", s.entry.Name, "transport", s.transport, "tools", len(s.tools))
	}
	return m
}

func checkMCPEntry(e agentproto.MCPServer, seen map[string]bool) error {
	switch {
	case !mcpServerName.MatchString(e.Name) || len(e.Name) > 32:
		return fmt.Errorf("MCP server name %q is not 1 to 32 letters, digits, '-' or single '_'", e.Name)
	case seen[e.Name]:
		return fmt.Errorf("MCP server %s is configured twice", e.Name)
	case (len(e.Command) > 0) == (e.URL != ""):
		return fmt.Errorf("MCP server %s needs exactly one of command and url", e.Name)
	case len(e.Command) > 0 && e.Command[0] == "":
		return fmt.Errorf("MCP server %s has an empty command", e.Name)
	case e.TimeoutSeconds < 0:
		return fmt.Errorf("MCP server %s has a negative timeout", e.Name)
	}
	return nil
}

func mcpFullName(server, tool string) string { return MCPPrefix + server + "__" + tool }

// Tools are the servers' tools, in the order of the entries and of each
// server's list.
func (m *MCPServers) Tools() []Tool {
	var out []Tool
	for _, s := range m.servers {
		out = append(out, s.tools...)
	}
	return out
}

// Status is each server's line in the run's record.
func (m *MCPServers) Status() []agentproto.MCPStatus {
	var out []agentproto.MCPStatus
	for _, s := range m.servers {
		st := agentproto.MCPStatus{Name: CleanText(s.entry.Name), Transport: s.transport}
		if s.err != nil {
			st.Error = CleanText(s.err.Error())
		} else {
			for _, t := range s.tools {
				st.Tools = append(st.Tools, t.Spec().Name)
			}
		}
		out = append(out, st)
	}
	return out
}

// PromptNote tells the model which servers are unavailable, so it does not
// look for their tools; "" when all of them answered.
func (m *MCPServers) PromptNote() string {
	var lines []string
	for _, s := range m.servers {
		if s.err != nil {
			lines = append(lines, fmt.Sprintf("- %s: %s", s.entry.Name, CleanText(s.err.Error())))
		}
	}
	if len(lines) == 0 {
		return ""
	}
	return "# Unavailable MCP servers\n\nThese MCP servers could not be used in this run:\n" + strings.Join(lines, "\n")
}

// Close ends every session; a stdio server is killed with its process group.
func (m *MCPServers) Close() {
	for _, s := range m.servers {
		s.stop()
	}
}

// stop ends the server's session and process, at once for one that failed.
func (s *mcpServer) stop() {
	if s.session != nil {
		s.session.Close()
	}
	if s.proc != nil {
		s.proc.Close()
	}
}

func (s *mcpServer) connect(ctx context.Context, env Env, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	transport, err := s.newTransport(env)
	if err != nil {
		s.err = err
		return
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "berth-agent", Version: "1"},
		&mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}})
	session, err := client.Connect(ctx, transport, nil)
	if err != nil {
		s.err = s.failure(ctx, "did not start", err)
		s.stop()
		return
	}
	s.session = session
	var tools []Tool
	for t, err := range session.Tools(ctx, nil) {
		if err != nil {
			s.err = s.failure(ctx, "did not list its tools", err)
			s.stop()
			return
		}
		if len(s.entry.Tools) > 0 && !slices.Contains(s.entry.Tools, t.Name) {
			continue
		}
		full := mcpFullName(s.entry.Name, t.Name)
		if !mcpToolName.MatchString(full) {
			log.Warn("MCP tool left out: its name is not 1 to 64 letters, digits, '_' or '-'", "server", s.entry.Name, "tool", CleanText(t.Name))
			continue
		}
		if slices.ContainsFunc(tools, func(o Tool) bool { return o.Spec().Name == full }) {
			log.Warn("MCP tool left out: the server lists it twice", "server", s.entry.Name, "tool", t.Name)
			continue
		}
		if len(tools) == mcpMaxTools {
			log.Warn("MCP tools left out: a server gives at most 128", "server", s.entry.Name)
			break
		}
		tools = append(tools, mcpTool{server: s, name: t.Name, spec: provider.Tool{
			Name:        full,
			Description: toolDescription(t),
			Parameters:  toolParameters(t.InputSchema),
		}})
	}
	// Its resources and prompts, as tools, when it has them.
	tools = append(tools, s.resourceTools(ctx, tools, log)...)
	for _, name := range s.entry.Tools {
		if !slices.ContainsFunc(tools, func(t Tool) bool { return t.Spec().Name == mcpFullName(s.entry.Name, name) }) {
			log.Warn("MCP tool named in the entry's tools is not offered by the server", "server", s.entry.Name, "tool", name)
		}
	}
	s.tools = tools
}

// failure explains a failed exchange with the server: a timeout as such,
// and a stdio server's exit with its status and stderr.
func (s *mcpServer) failure(ctx context.Context, what string, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("MCP server %s %s: no answer within %s", s.entry.Name, what, s.timeout)
	}
	if s.proc != nil {
		if exit := s.proc.exitReason(mcpStopGrace); exit != "" {
			err = fmt.Errorf("%w (%s)", err, exit)
		}
	}
	text := err.Error()
	// The SDK flattens the decoder's error into text: match its wording too.
	var syntax *json.SyntaxError
	if errors.As(err, &syntax) || strings.Contains(text, "invalid character ") {
		text = "it answered something that is not MCP's JSON-RPC: " + text
	}
	if len(text) > mcpMaxError {
		text = strings.ToValidUTF8(text[:mcpMaxError], "") + "…"
	}
	return fmt.Errorf("MCP server %s %s: %s", s.entry.Name, what, text)
}

func (s *mcpServer) newTransport(env Env) (mcp.Transport, error) {
	if s.entry.URL == "" {
		t := &stdioTransport{env: env, argv: s.entry.Command}
		s.proc = &t.proc
		return t, nil
	}
	u, err := url.Parse(s.entry.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("MCP server %s: its url is not an http(s) URL", s.entry.Name)
	}
	if u.User != nil {
		// A credential here would sit in the sandbox: the proxy adds it instead.
		return nil, fmt.Errorf("MCP server %s: its url carries credentials; give them to the egress proxy as a secret", s.entry.Name)
	}
	if env.ProxyURL == "" {
		// Its headers exist only as egress secrets, and a direct network
		// would leave its requests unjudged and unrecorded.
		return nil, fmt.Errorf("MCP server %s: an HTTP server is reached only through the run's egress proxy, and this run has none", s.entry.Name)
	}
	tr, err := env.webTransport()
	if err != nil {
		return nil, fmt.Errorf("MCP server %s: %w", s.entry.Name, err)
	}
	tr.ResponseHeaderTimeout = s.timeout
	var rt http.RoundTripper = tr
	if env.Own != nil && !s.entry.Workspace {
		// berth.toml's server: on berth-agent's own channel, where its host
		// and headers_secret apply; a workspace's goes the tools' way.
		rt = env.Own(tr)
	}
	return &mcp.StreamableClientTransport{
		Endpoint:   u.String(),
		HTTPClient: &http.Client{Transport: rt},
		MaxRetries: -1,
		// Only answers to the agent's own requests: no stream that stays
		// open through the proxy for notifications the agent ignores.
		DisableStandaloneSSE: true,
	}, nil
}

func toolDescription(t *mcp.Tool) string {
	d := t.Description
	if d == "" {
		d = t.Title
	}
	d = CleanText(d)
	if len(d) > mcpDescription {
		d = strings.ToValidUTF8(d[:mcpDescription], "") + "…"
	}
	return d
}

// toolParameters is the tool's input schema as the provider gets it; one
// that is not a JSON object becomes an open object schema.
func toolParameters(inputSchema any) json.RawMessage {
	raw, err := json.Marshal(inputSchema)
	var obj map[string]json.RawMessage
	if err != nil || len(raw) > mcpMaxSchema || json.Unmarshal(raw, &obj) != nil || obj == nil {
		return schema(`{"type":"object"}`)
	}
	if _, ok := obj["type"]; !ok {
		obj["type"] = json.RawMessage(`"object"`)
		raw, _ = json.Marshal(obj)
	}
	return raw
}

// mcpTool is one tool of an MCP server, as the model sees it.
type mcpTool struct {
	server *mcpServer
	name   string
	spec   provider.Tool
}

func (t mcpTool) Spec() provider.Tool { return t.spec }

func (t mcpTool) Call(ctx context.Context, raw json.RawMessage) (string, error) {
	s := t.server
	if s.err != nil {
		return "", fmt.Errorf("this tool is unavailable: %w", s.err)
	}
	args := raw
	if len(bytes.TrimSpace(args)) == 0 {
		args = json.RawMessage("{}")
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(args, &obj); err != nil || obj == nil {
		return "", errors.New("bad arguments: not a JSON object")
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	res, err := s.session.CallTool(ctx, &mcp.CallToolParams{Name: t.name, Arguments: args})
	if err != nil {
		return "", s.failure(ctx, "failed on "+t.name, err)
	}
	out := &capped{limit: MCPOutputLimit}
	for i, c := range res.Content {
		if i > 0 {
			out.Write([]byte("\n"))
		}
		io.WriteString(out, contentText(c))
	}
	if len(res.Content) == 0 && res.StructuredContent != nil {
		data, _ := json.Marshal(res.StructuredContent)
		out.Write(data)
	}
	text := CleanText(out.String())
	if res.IsError {
		return "", fmt.Errorf("MCP server %s reported an error from %s: %s", s.entry.Name, t.name, text)
	}
	return text, nil
}

func contentText(c mcp.Content) string {
	switch c := c.(type) {
	case *mcp.TextContent:
		return c.Text
	case *mcp.ImageContent:
		return fmt.Sprintf("[image %s, %d bytes, not shown]", c.MIMEType, len(c.Data))
	case *mcp.AudioContent:
		return fmt.Sprintf("[audio %s, %d bytes, not shown]", c.MIMEType, len(c.Data))
	case *mcp.ResourceLink:
		return fmt.Sprintf("[resource %s]", c.URI)
	case *mcp.EmbeddedResource:
		if c.Resource != nil && c.Resource.Text != "" {
			return c.Resource.Text
		}
		if c.Resource != nil {
			return fmt.Sprintf("[resource %s, %d bytes, not shown]", c.Resource.URI, len(c.Resource.Blob))
		}
	}
	return fmt.Sprintf("[%T content, not shown]", c)
}

// stdioTransport starts a stdio server the way the shell tool starts a
// command: through the tool launcher (the tools' Landlock domain), in the
// workspace, with the tools' environment, in a process group of its own.
type stdioTransport struct {
	env  Env
	argv []string
	proc stdioProcess
}

func (t *stdioTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	path, err := lookPath(t.argv[0])
	if err != nil {
		return nil, err
	}
	if err := t.proc.start(t.env, path, t.argv); err != nil {
		return nil, err
	}
	return (&mcp.IOTransport{Reader: &t.proc, Writer: &t.proc}).Connect(ctx)
}

// lookPath finds a command without a slash in the shell's PATH, not in
// berth-agent's own environment.
func lookPath(name string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, dir := range filepath.SplitList(ShellPath) {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("cannot find %s in %s", name, ShellPath)
}

// stdioProcess is a running stdio server: its stdin and stdout are our
// ends of two pipes, which its exit (or its kill) closes for good.
type stdioProcess struct {
	cmd    *exec.Cmd
	procs  Processes
	stdin  *os.File
	stdout *os.File
	stderr lockedCapped
	done   chan struct{}
	once   sync.Once
	// ended is set when the server's stdout ended before the agent closed
	// it: the server exited (or closed it) on its own, which explains a
	// failure, unlike an exit after the agent gave up on it.
	ended atomic.Bool
}

func (p *stdioProcess) start(env Env, path string, argv []string) error {
	inR, inW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("cannot make a pipe: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return fmt.Errorf("cannot make a pipe: %w", err)
	}
	defer inR.Close()
	defer outW.Close()
	p.stderr.c.limit = mcpStderrLimit
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Dir = env.Workspace
	cmd.Env = append([]string{"PATH=" + ShellPath, "HOME=" + env.Workspace, "TMPDIR=" + env.TmpDir, "LANG=C.UTF-8"}, env.ProxyEnv...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, &p.stderr
	// Killed with its group at the run's end, and with berth-agent should
	// the agent itself be killed first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = time.Second
	p.procs = env.processes()
	if err := p.procs.Start(cmd); err != nil {
		inW.Close()
		outR.Close()
		return fmt.Errorf("cannot start %s: %w", argv[0], err)
	}
	p.cmd, p.stdin, p.stdout, p.done = cmd, inW, outR, make(chan struct{})
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	return nil
}

func (p *stdioProcess) Read(b []byte) (int, error) {
	n, err := p.stdout.Read(b)
	if errors.Is(err, io.EOF) {
		p.ended.Store(true)
	}
	return n, err
}

func (p *stdioProcess) Write(b []byte) (int, error) { return p.stdin.Write(b) }

// Close closes the server's stdin, gives it mcpStopGrace to exit and then
// kills its process group; it returns once the server is gone.
func (p *stdioProcess) Close() error {
	p.once.Do(func() {
		if p.cmd == nil {
			return
		}
		p.stdin.Close()
		select {
		case <-p.done:
		case <-time.After(mcpStopGrace):
		}
		p.procs.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		p.stdout.Close()
	})
	return nil
}

// exitReason is how the server ended and what it said on stderr, waiting
// up to wait for its end (its stdout may close a moment before); "" while
// it runs.
func (p *stdioProcess) exitReason(wait time.Duration) string {
	if p.done == nil || !p.ended.Load() {
		return ""
	}
	select {
	case <-p.done:
	case <-time.After(wait):
		return ""
	}
	reason := p.cmd.ProcessState.String()
	if msg := strings.TrimSpace(p.stderr.String()); msg != "" {
		reason += "; stderr: " + CleanText(msg)
	}
	return reason
}

// lockedCapped is capped, for a writer exec's copying goroutine feeds.
type lockedCapped struct {
	mu sync.Mutex
	c  capped
}

func (l *lockedCapped) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c.Write(b)
}

func (l *lockedCapped) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c.String()
}
