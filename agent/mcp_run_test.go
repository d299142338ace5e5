package agent_test

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
	"github.com/berth-dev/berth/services/egress"
)

// The test binaries of this file, built once into testDir (which every
// user may enter): the stdio MCP server and the egress proxy.
var (
	mcpServerBinary = sync.OnceValues(func() (string, error) {
		return testenv.BuildStatic(testDir, "mcpserver", "./testdata/mcpserver")
	})
	egressBinary = sync.OnceValues(func() (string, error) {
		return testenv.Build(testDir, "berth-egress", "github.com/berth-dev/berth/cmd/berth-egress")
	})
)

func built(t *testing.T, build func() (string, error)) string {
	t.Helper()
	bin, err := build()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// toolResults counts the tool results the model has seen so far.
func toolResults(r oaRequest) int {
	n := 0
	for _, m := range r.Messages {
		if m.Role == "tool" {
			n++
		}
	}
	return n
}

// scripted calls each tool of calls in turn, then answers "done".
func scripted(calls ...[2]any) func(oaRequest) (int, string) {
	return func(r oaRequest) (int, string) {
		n := toolResults(r)
		if n == len(calls) {
			return oaText("done")
		}
		return oaCall("call_"+strconv.Itoa(n), calls[n][0].(string), calls[n][1])
	}
}

func TestAStdioMCPServerRunsInTheToolsConfinementAndEndsWithTheRun(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	bin := built(t, mcpServerBinary)
	f := newFixture(t)
	writeFile(t, filepath.Join(f.workspace, "notes.txt"), "workspace notes")
	pidFile := filepath.Join(f.workspace, "mcp.pid")
	model := newFakeOpenAI(t, scripted(
		[2]any{"mcp__files__read", map[string]string{"path": f.config}},
		[2]any{"mcp__files__parent", map[string]string{}},
		[2]any{"mcp__files__read", map[string]string{"path": "notes.txt"}},
	))
	req := f.openAIRequest(model, "use the files server")
	// What a host run's policy holds: the agent's own /proc entry, which
	// the tools' domain (and so the server's) leaves out.
	req.Policy.AllowRead = append(req.Policy.AllowRead, "/proc/self", bin)
	req.MCP = []agentproto.MCPServer{{Name: "files", Command: []string{bin, "serve", pidFile}, Tools: []string{"read", "parent", "fail"}}}
	req.Agent.Tools.Deny = []string{"mcp__files__fail"}

	res := runAgent(t, req)
	res.expect(t, agentproto.ExitOK, "done")
	wantStatus := []agentproto.MCPStatus{{Name: "files", Transport: "stdio", Tools: []string{"mcp__files__fail", "mcp__files__parent", "mcp__files__read"}}}
	if got := res.resp.MCP; len(got) != 1 || got[0].Error != "" || !slices.Equal(got[0].Tools, wantStatus[0].Tools) {
		t.Errorf("the record's MCP line = %+v, want %+v", got, wantStatus)
	}
	offered := model.requests()[0].toolNames()
	for _, name := range []string{"mcp__files__read", "mcp__files__parent", "shell"} {
		if !slices.Contains(offered, name) {
			t.Errorf("the model was not offered %s: %v", name, offered)
		}
	}
	for _, name := range []string{"mcp__files__fail", "mcp__files__hidden", "mcp__files__echo"} {
		if slices.Contains(offered, name) {
			t.Errorf("the model was offered %s, which the agent's deny or the entry's tools leave out", name)
		}
	}
	calls := res.resp.ToolCalls
	if len(calls) != 3 {
		t.Fatalf("tool calls = %+v, want 3", calls)
	}
	if !strings.Contains(calls[0].Error, "permission denied") {
		t.Errorf("the server read a file outside the policy: %+v", calls[0])
	}
	if !strings.Contains(calls[1].Error, "permission denied") {
		t.Errorf("the server reached berth-agent's own /proc entry, which tools may not: %+v", calls[1])
	}
	if calls[2].Error != "" || calls[2].Output != "workspace notes" {
		t.Errorf("the server did not read the workspace: %+v", calls[2])
	}
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(string(data))
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the MCP server (pid %d) outlived its run: kill 0 = %v", pid, err)
	}
}

// In a container the stdio server runs from the workspace (the image holds
// only the agent) in the tools' domain, and answers through the SDK.
func TestAStdioMCPServerAnswersInAContainerRun(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	cli := testdocker.Engine(t)
	b, err := container.New(container.Options{Client: cli, Instance: t.Name() + "@" + strconv.Itoa(os.Getpid())})
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(t.TempDir(), "ws")
	if err := os.Mkdir(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	server, err := os.ReadFile(built(t, mcpServerBinary))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "mcpserver"), server, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{ws, filepath.Join(ws, "mcpserver")} {
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	runID := fmt.Sprintf("mcp%d", time.Now().UnixNano())
	s := isolation.Spec{
		Plan: isolation.Plan{
			Backend: isolation.BackendContainer, RunID: runID, AgentID: "tester",
			Workspace: ws, SandboxWorkspace: isolation.ContainerWorkspace, AgentBinary: agentBinary, RunAs: "nobody",
			Timeout: 60 * time.Second, Policy: isolation.ContainerPolicy(false),
			Limits:  isolation.Limits{MemoryBytes: 512 << 20, Pids: 256, NanoCPUs: 1e9, TmpfsBytes: 64 << 20},
			Network: isolation.Network{Mode: "none"},
			Mounts:  []isolation.Mount{{Source: ws, Target: isolation.ContainerWorkspace}},
		},
		Request: agentproto.Request{
			Version: agentproto.Version, RunID: runID, Agent: agentproto.Agent{ID: "tester", MaxIterations: 3},
			Message:  agentproto.Message{ID: runID, Author: "t", Text: `/tool mcp__files__echo {"text":"from the container"}`},
			Provider: agentproto.Provider{Name: "local", Kind: "local"},
			MCP:      []agentproto.MCPServer{{Name: "files", Command: []string{isolation.ContainerWorkspace + "/mcpserver", "serve"}, Tools: []string{"echo"}}},
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := b.Run(ctx, s)
	if err != nil {
		t.Fatalf("container run failed: %v\nstderr: %s", err, res.Stderr)
	}
	if want := "[mcp__files__echo]\necho: from the container"; res.Response.Reply != want {
		t.Errorf("reply = %q, want %q\nstderr: %s", res.Response.Reply, want, res.Stderr)
	}
	if st := res.Response.MCP; len(st) != 1 || st[0].Error != "" || !slices.Equal(st[0].Tools, []string{"mcp__files__echo"}) {
		t.Errorf("the record's MCP line = %+v, want the server's echo", st)
	}
}

// trackerKey is the header value the HTTP MCP server insists on; only the
// egress proxy holds it.
const trackerKey = "tracker-key-SECRET-0123456789"

func TestAnHTTPMCPServerGetsItsHeaderFromTheProxyAndTheSandboxNeverSeesIt(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	testenv.NeedRoot(t)
	// A tool that reads everything of the sandbox's a header could be in:
	// its environment, the workspace, TMPDIR, the CA bundle; the needle is
	// built by the shell so that the message does not hold it.
	const look = `k=tracker-key-SECRET; k=$k-0123456789; env; grep -rIls -- "$k" "$HOME" "$TMPDIR" "$SSL_CERT_FILE" /proc/self/environ /etc/passwd | sed 's/^/FOUND /'; echo looked`

	tests := []struct {
		name        string
		secretPaths []string // the secret's scope; the MCP endpoint is /mcp
		authorized  bool
	}{
		{name: "With_the_egress_secret_the_servers_tools_answer", authorized: true},
		{name: "Outside_the_secrets_scope_the_server_refuses_and_the_model_gets_a_tool_error", secretPaths: []string{"/elsewhere"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var authorized, refused atomic.Int64
			mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return trackerServer() }, nil)
			tracker := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-Tracker-Key") != trackerKey {
					refused.Add(1)
					http.Error(w, "missing or wrong X-Tracker-Key", http.StatusUnauthorized)
					return
				}
				authorized.Add(1)
				mcpHandler.ServeHTTP(w, r)
			}))
			tracker.Config.ErrorLog = log.New(io.Discard, "", 0)
			tracker.StartTLS() // its certificate names 127.0.0.1
			t.Cleanup(tracker.Close)
			_, portText, _ := net.SplitHostPort(tracker.Listener.Addr().String())
			port, _ := strconv.Atoi(portText)

			model := newFakeOpenAI(t, scripted(
				[2]any{"mcp__tracker__search_issues", map[string]string{"query": "login"}},
				[2]any{"shell", map[string]string{"command": look}},
			))
			root := users(t)[1]
			f := openFixture(t, root)
			proxy, bundle := launchEgress(t, f, model, tt.secretPaths, port, tracker)

			req := f.hostRequest("search the tracker")
			req.Provider = agentproto.Provider{Name: "fake", Kind: "openai", Model: "gpt-test", Proxied: true,
				BaseURL: isolation.ProviderProxyURL("127.0.0.1:3128", "fake"), Endpoint: "http://model.test/v1"}
			req.Policy.Network = false
			req.Policy.ConnectPorts = []uint16{isolation.EgressProxyPort}
			req.Policy.AllowRead = append(req.Policy.AllowRead, bundle)
			req.Egress = &agentproto.Egress{ProxyAddr: "127.0.0.1:3128", Socket: proxy.socket, Token: egressToken, CABundle: bundle}
			req.MCP = []agentproto.MCPServer{{Name: "tracker", URL: "https://127.0.0.1:" + portText + "/mcp", Tools: []string{"search_issues"}, TimeoutSeconds: 20}}

			res := runInNamespace(t, req, root, &syscall.SysProcAttr{})
			res.expect(t, agentproto.ExitOK, "done")
			if strings.Contains(res.stdout+res.stderr, trackerKey) {
				t.Fatalf("the header value reached the sandbox's output:\n%s\n%s", res.stdout, res.stderr)
			}
			calls := res.resp.ToolCalls
			if len(calls) != 2 {
				t.Fatalf("tool calls = %+v, want the MCP call and the shell", calls)
			}
			var shell agentproto.ToolCall = calls[1]
			if !strings.Contains(shell.Output, "looked") || strings.Contains(shell.Output, "FOUND") || !strings.Contains(shell.Output, "HTTPS_PROXY=") {
				t.Errorf("the tool that looked for the header found it, or did not look:\n%s", shell.Output)
			}
			status := res.resp.MCP
			if len(status) != 1 {
				t.Fatalf("the record's MCP lines = %+v, want one", status)
			}
			decisions := proxy.stop()
			if tt.authorized {
				if status[0].Error != "" || !slices.Equal(status[0].Tools, []string{"mcp__tracker__search_issues"}) {
					t.Errorf("the record's MCP line = %+v, want the server's one allowed tool", status[0])
				}
				if calls[0].Error != "" || calls[0].Output != "issue 7: login fails" {
					t.Errorf("the MCP call = %+v, want the server's answer", calls[0])
				}
				if authorized.Load() == 0 || refused.Load() != 0 {
					t.Errorf("the server saw %d requests with its header and %d without; want all with it", authorized.Load(), refused.Load())
				}
				if !slices.ContainsFunc(decisions, func(d isolation.EgressDecision) bool { return d.Allowed && d.Rule == "secret tracker" }) {
					t.Errorf("the proxy recorded no request under the tracker's secret: %+v", decisions)
				}
				return
			}
			if !strings.Contains(status[0].Error, "MCP server tracker did not start") || !strings.Contains(status[0].Error, "Unauthorized") {
				t.Errorf("the record's MCP line = %+v, want the server's refusal", status[0])
			}
			if !strings.Contains(calls[0].Error, "this tool is unavailable") || !strings.Contains(calls[0].Error, "Unauthorized") {
				t.Errorf("the model's call of the refused server's tool = %+v, want a tool error saying why", calls[0])
			}
			if refused.Load() == 0 || authorized.Load() != 0 {
				t.Errorf("the server saw %d requests with its header and %d without; want all without it", authorized.Load(), refused.Load())
			}
		})
	}
}

// launchedEgress is a real berth-egress process for one run.
type launchedEgress struct {
	socket string
	stop   func() []isolation.EgressDecision
}

// launchEgress starts berth-egress as the scheduler does (as nobody, on the
// run's socket), with the fake model as the run's provider, an allow rule
// for the tracker at 127.0.0.1:port and the tracker's header as an egress
// secret for secretPaths (all of them when empty). It returns the proxy and
// the run's CA bundle.
func launchEgress(t *testing.T, f fixture, model *fakeOpenAI, secretPaths []string, port int, tracker *httptest.Server) (launchedEgress, string) {
	t.Helper()
	nobody, err := isolation.LookupRunUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	ca, err := egress.NewCA("run-1", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	rule, err := isolation.ParseEgressRule("127.0.0.1:" + strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	pol := egress.Policy{RunID: "run-1", Agent: "alpha", Token: egressToken, Allow: []isolation.EgressRule{rule}, CA: &ca,
		Providers: []egress.Provider{{Name: "fake", Kind: "openai", BaseURL: model.srv.URL + "/v1", Model: "gpt-test", Key: providerKey}},
		Secrets: []egress.Secret{{Name: "tracker", Hosts: []string{"127.0.0.1"}, Ports: []int{port}, Paths: secretPaths,
			Header: "X-Tracker-Key", Format: "{}", Value: trackerKey}}}
	socket := filepath.Join(f.root, "egress", "run-1", isolation.EgressSocketName)
	p, err := egress.Launch(context.Background(), pol, egress.LaunchOptions{
		Binary: built(t, egressBinary), User: nobody, Client: nobody, Socket: socket,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		RootCAsPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tracker.Certificate().Raw}),
		CABundle:   ca.Bundle(),
	})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	var decisions []isolation.EgressDecision
	stop := func() []isolation.EgressDecision {
		once.Do(func() { decisions = p.Stop().Decisions })
		return decisions
	}
	t.Cleanup(func() { stop() })
	return launchedEgress{socket: socket, stop: stop}, filepath.Join(filepath.Dir(socket), isolation.EgressCABundleName)
}

// trackerServer is the HTTP MCP server's tools: search_issues and one the
// entry leaves out.
func trackerServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "tracker", Version: "1"}, nil)
	type query struct {
		Query string `json:"query"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "search_issues", Description: "Search the issues."}, func(_ context.Context, _ *mcp.CallToolRequest, q query) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "issue 7: " + q.Query + " fails"}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "delete_issue", Description: "Delete an issue."}, func(context.Context, *mcp.CallToolRequest, query) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "deleted"}}}, nil, nil
	})
	return s
}
