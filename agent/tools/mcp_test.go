package tools

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// mcpServerBinary is ../testdata/mcpserver, built once for this package.
var mcpServerBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "berth-mcpserver-")
	if err != nil {
		return "", err
	}
	return testenv.Build(dir, "mcpserver", "../testdata/mcpserver")
})

func testServerBinary(t *testing.T) string {
	t.Helper()
	bin, err := mcpServerBinary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func connect(t *testing.T, env Env, entries ...agentproto.MCPServer) *MCPServers {
	t.Helper()
	m := ConnectMCP(context.Background(), env, entries, quietLog)
	t.Cleanup(m.Close)
	return m
}

func toolNames(tools []Tool) []string {
	var out []string
	for _, t := range tools {
		out = append(out, t.Spec().Name)
	}
	return out
}

func TestAStdioServersToolsJoinTheToolSetFilteredByItsEntry(t *testing.T) {
	t.Parallel()
	env := workspace(t)
	m := connect(t, env, agentproto.MCPServer{Name: "files", Command: []string{testServerBinary(t), "serve"}, Tools: []string{"echo", "read", "fail", "missing"}})
	st := m.Status()
	if len(st) != 1 || st[0].Error != "" || st[0].Transport != "stdio" {
		t.Fatalf("status = %+v, want one stdio server without error", st)
	}
	want := []string{"mcp__files__echo", "mcp__files__fail", "mcp__files__read"}
	if got := toolNames(m.Tools()); !slices.Equal(got, want) {
		t.Fatalf("tools = %v, want %v (hidden and sleep left out by the entry)", got, want)
	}
	set := Filter(m.Tools(), nil, []string{"mcp__files__read"})
	if out, err := set.Call(context.Background(), "mcp__files__echo", json.RawMessage(`{"text":"hi"}`)); err != nil || out != "echo: hi" {
		t.Errorf("echo = %q, %v; want %q", out, err, "echo: hi")
	}
	if _, err := set.Call(context.Background(), "mcp__files__read", json.RawMessage(`{"path":"/etc/hostname"}`)); err == nil {
		t.Error("a tool the agent's deny names was called")
	}
	if _, err := set.Call(context.Background(), "mcp__files__fail", nil); err == nil || !strings.Contains(err.Error(), "the tracker is down") {
		t.Errorf("a tool that reports an error gave %v, want its text as the error", err)
	}
	if _, err := set.Call(context.Background(), "mcp__files__echo", json.RawMessage(`["not","an","object"]`)); err == nil || !strings.Contains(err.Error(), "not a JSON object") {
		t.Errorf("arguments that are no object gave %v", err)
	}
}

func TestAServerThatFailsGivesAToolErrorAndARecordLineInBoundedTime(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		entry   func(bin string) agentproto.MCPServer
		errHas  []string
		maxTime time.Duration
	}{
		{
			name:    "A_server_that_answers_garbage",
			entry:   func(bin string) agentproto.MCPServer { return agentproto.MCPServer{Command: []string{bin, "garbage"}} },
			errHas:  []string{"MCP server broken did not start: it answered something that is not MCP's JSON-RPC"},
			maxTime: 20 * time.Second,
		},
		{
			name:    "A_server_that_never_answers",
			entry:   func(bin string) agentproto.MCPServer { return agentproto.MCPServer{Command: []string{bin, "hang"}} },
			errHas:  []string{"MCP server broken did not start", "no answer within 1s"},
			maxTime: 20 * time.Second,
		},
		{
			name:    "A_server_that_exits",
			entry:   func(bin string) agentproto.MCPServer { return agentproto.MCPServer{Command: []string{bin, "exit"}} },
			errHas:  []string{"MCP server broken did not start", "exit status 3", "cannot open the issue database"},
			maxTime: 20 * time.Second,
		},
		{
			name: "A_command_that_does_not_exist",
			entry: func(string) agentproto.MCPServer {
				return agentproto.MCPServer{Command: []string{"no-such-mcp-server"}}
			},
			errHas: []string{"cannot find no-such-mcp-server in " + ShellPath},
		},
		{
			name: "An_entry_with_a_command_and_a_url",
			entry: func(bin string) agentproto.MCPServer {
				return agentproto.MCPServer{Command: []string{bin}, URL: "https://x.test/mcp"}
			},
			errHas: []string{"needs exactly one of command and url"},
		},
		{
			name:   "An_http_server_of_an_agent_without_egress_proxy",
			entry:  func(string) agentproto.MCPServer { return agentproto.MCPServer{URL: "https://x.test/mcp"} },
			errHas: []string{"an HTTP server is reached only through the run's egress proxy, and this run has none"},
		},
		{
			name:   "An_http_url_with_credentials",
			entry:  func(string) agentproto.MCPServer { return agentproto.MCPServer{URL: "https://bot:hunter2@x.test/mcp"} },
			errHas: []string{"its url carries credentials"},
		},
		{
			name: "An_http_server_that_answers_garbage",
			entry: func(string) agentproto.MCPServer {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "application/json")
					io.WriteString(w, "<html>not MCP</html>")
				}))
				t.Cleanup(srv.Close)
				return agentproto.MCPServer{URL: srv.URL + "/mcp"}
			},
			errHas:  []string{"MCP server broken did not start: it answered something that is not MCP's JSON-RPC"},
			maxTime: 20 * time.Second,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := workspace(t)
			entry := tt.entry(testServerBinary(t))
			if strings.HasPrefix(entry.URL, "http://127.0.0.1") {
				env = behindEgress(t, env, strings.TrimSuffix(strings.TrimPrefix(entry.URL, "http://"), "/mcp"))
			}
			entry.Name, entry.TimeoutSeconds, entry.Tools = "broken", 1, []string{"search_issues"}
			start := time.Now()
			m := connect(t, env, entry)
			if took := time.Since(start); tt.maxTime > 0 && took > tt.maxTime {
				t.Errorf("connecting took %s", took)
			}
			st := m.Status()
			if len(st) != 1 || st[0].Tools != nil {
				t.Fatalf("status = %+v, want one server without tools", st)
			}
			t.Logf("record line: %s", st[0].Error)
			for _, want := range tt.errHas {
				if !strings.Contains(st[0].Error, want) {
					t.Errorf("record line %q lacks %q", st[0].Error, want)
				}
			}
			if !strings.Contains(m.PromptNote(), "broken: "+st[0].Error) {
				t.Errorf("the prompt note does not name the server and its error:\n%s", m.PromptNote())
			}
			// The tool its entry names is there, and tells the model why it fails.
			_, err := Filter(m.Tools(), nil, nil).Call(context.Background(), "mcp__broken__search_issues", json.RawMessage(`{}`))
			if err == nil || !strings.Contains(err.Error(), st[0].Error) {
				t.Errorf("calling the unavailable tool gave %v, want the server's error", err)
			}
		})
	}
}

func TestBadEntriesNeverOfferANameTheModelAPIRefusesOrOneTwice(t *testing.T) {
	t.Parallel()
	bin := testServerBinary(t)
	m := connect(t, workspace(t),
		agentproto.MCPServer{Name: "files", Command: []string{bin, "serve"}, Tools: []string{"echo"}},
		agentproto.MCPServer{Name: "files", Command: []string{bin, "serve"}, Tools: []string{"echo"}},
		agentproto.MCPServer{Name: "bad name", Command: []string{bin, "serve"}, Tools: []string{"echo"}},
		agentproto.MCPServer{Name: "long", Command: []string{"no-such-server"}, Tools: []string{strings.Repeat("x", 60), "ok"}},
		agentproto.MCPServer{Name: "dupes", Command: []string{bin, "dupes"}},
	)
	if got, want := toolNames(m.Tools()), []string{"mcp__files__echo", "mcp__long__ok", "mcp__dupes__echo"}; !slices.Equal(got, want) {
		t.Errorf("tools = %v, want %v", got, want)
	}
	st := m.Status()
	if len(st) != 5 || st[0].Error != "" || st[4].Error != "" || !strings.Contains(st[1].Error, "MCP server files is configured twice") ||
		!strings.Contains(st[2].Error, `MCP server name "bad name" is not`) || !strings.Contains(st[3].Error, "cannot find no-such-server") {
		t.Errorf("status = %+v", st)
	}
}

func TestACallThatHangsIsAToolErrorAfterTheTimeout(t *testing.T) {
	t.Parallel()
	m := connect(t, workspace(t), agentproto.MCPServer{Name: "slow", Command: []string{testServerBinary(t), "serve"}, TimeoutSeconds: 1})
	start := time.Now()
	_, err := Filter(m.Tools(), nil, nil).Call(context.Background(), "mcp__slow__sleep", nil)
	if err == nil || !strings.Contains(err.Error(), "MCP server slow failed on sleep: no answer within 1s") {
		t.Fatalf("a hung call gave %v", err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the hung call returned after %s", took)
	}
	// The server still answers the next call.
	if out, err := Filter(m.Tools(), nil, nil).Call(context.Background(), "mcp__slow__echo", json.RawMessage(`{"text":"still here"}`)); err != nil || out != "echo: still here" {
		t.Errorf("after a timed-out call: %q, %v", out, err)
	}
}

func TestAServerThatDiesMidRunGivesToolErrorsThatSayHow(t *testing.T) {
	t.Parallel()
	set := Filter(connect(t, workspace(t), agentproto.MCPServer{Name: "files", Command: []string{testServerBinary(t), "serve"}}).Tools(), nil, nil)
	_, err := set.Call(context.Background(), "mcp__files__crash", nil)
	if err == nil || !strings.Contains(err.Error(), "MCP server files failed on crash") || !strings.Contains(err.Error(), "exit status 5; stderr: mcpserver: out of memory") {
		t.Fatalf("a call that killed the server gave %v", err)
	}
	t.Logf("crash: %v", err)
	_, err = set.Call(context.Background(), "mcp__files__echo", json.RawMessage(`{"text":"x"}`))
	t.Logf("after: %v", err)
	if err == nil || !strings.Contains(err.Error(), "MCP server files failed on echo") {
		t.Errorf("a call after the server died gave %v", err)
	}
}

func TestAStdioServerIsKilledWhenTheRunEnds(t *testing.T) {
	t.Parallel()
	env := workspace(t)
	pidFile := filepath.Join(env.Workspace, "server.pid")
	m := ConnectMCP(context.Background(), env, []agentproto.MCPServer{{Name: "files", Command: []string{testServerBinary(t), "serve", pidFile}}}, quietLog)
	if st := m.Status(); st[0].Error != "" {
		t.Fatal(st[0].Error)
	}
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(string(data))
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the server (pid %d) is not running: %v", pid, err)
	}
	m.Close()
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the server (pid %d) outlived the run's end: kill 0 = %v", pid, err)
	}
}

func TestAStreamableHTTPServersToolsAreCalled(t *testing.T) {
	t.Parallel()
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return testServer() }, nil)
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	env := behindEgress(t, workspace(t), srv.Listener.Addr().String())
	m := connect(t, env, agentproto.MCPServer{Name: "tracker", URL: srv.URL + "/mcp", Tools: []string{"echo"}})
	if st := m.Status(); st[0].Error != "" || st[0].Transport != "http" || !slices.Equal(st[0].Tools, []string{"mcp__tracker__echo"}) {
		t.Fatalf("status = %+v", st)
	}
	if out, err := Filter(m.Tools(), nil, nil).Call(context.Background(), "mcp__tracker__echo", json.RawMessage(`{"text":"over http"}`)); err != nil || out != "echo: over http" {
		t.Errorf("echo = %q, %v", out, err)
	}
}

// testServer is a one-tool server in the test process, for HTTP.
func testServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "tracker", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, a struct {
		Text string `json:"text"`
	}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo: " + a.Text}}}, nil, nil
	})
	return s
}
