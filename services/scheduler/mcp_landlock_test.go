package scheduler

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

// mcpServerBinary is the agent tests' stdio MCP server, built static into
// a directory the run user may enter.
var mcpServerBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "berth-scheduler-mcp-")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		return "", err
	}
	return testenv.BuildStatic(dir, "mcpserver", "../../agent/testdata/mcpserver")
})

// A landlock run of the real berth-agent starts the agent's configured
// stdio MCP server inside its sandbox; the model (the local provider,
// scripted by the message) calls one of its tools, and the run's record
// shows each server's status, a failing one's error too.
func TestALandlockRunCallsAnMCPToolAndItsRecordShowsTheServers(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	bin, err := mcpServerBinary()
	if err != nil {
		t.Fatalf("cannot build the MCP server: %v", err)
	}
	cfg := testConfig(1)
	cfg.Scheduler.AgentBinary = berthAgent(t)
	cfg.Agents[0].Provider = "local"
	// The server's program comes from the host's read set, which names it.
	cfg.Agents[0].FileAccess.AllowRead = []string{filepath.Dir(bin)}
	cfg.Agents[0].MCP = []config.MCPServer{
		{Name: "files", Command: []string{bin, "serve"}, Tools: []string{"echo", "read"}},
		{Name: "tracker", Command: []string{bin, "exit"}},
	}
	stateDir := sharedStateDir(t)
	s, err := New(cfg, stateDir, Options{
		Backends: map[string]isolation.Backend{landlock.Name: landlock.New()},
		Getenv:   func(string) string { return "" },
		Logger:   quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	start(t, s)

	id := submit(t, s, "m1", "alpha", "text", `/tool mcp__files__echo {"text":"from the sandbox"}`)
	r := waitFinished(t, s, id)
	if r.State != StateSucceeded || r.Reply != "[mcp__files__echo]\necho: from the sandbox" {
		t.Fatalf("run %s %s (%s): reply %q, error %q, stderr %q", r.ID, r.State, r.Reason, r.Reply, r.Error, r.StderrTail)
	}
	if len(r.MCP) != 2 {
		t.Fatalf("the record's MCP servers = %+v, want files and tracker", r.MCP)
	}
	files, tracker := r.MCP[0], r.MCP[1]
	if files.Name != "files" || files.Transport != "stdio" || files.Error != "" || !slices.Equal(files.Tools, []string{"mcp__files__echo", "mcp__files__read"}) {
		t.Errorf("files = %+v, want stdio with echo and read, the entry's tools", files)
	}
	if tracker.Name != "tracker" || !strings.Contains(tracker.Error, "cannot open the issue database") {
		t.Errorf("tracker = %+v, want its error with the server's stderr", tracker)
	}

	servers, err := r.BusRun().MCPServers()
	if err != nil || len(servers) != 2 || servers[1].Error != tracker.Error {
		t.Errorf("GetRun's mcp = %+v, %v; want the record's two servers", servers, err)
	}
}

const trackerTestKey = "tracker-key-SECRET-0123456789"

// An HTTP MCP server's headers_secret, loaded from berth.toml like an
// admin writes it, is one of the run's egress secrets: the run's proxy adds
// it to the server's requests (which the server refuses without it), and
// the request the sandbox reads names the server but never holds the key.
func TestAnHTTPMCPServerGetsItsHeadersSecretFromTheRunsProxy(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	_, proxyBin := egressBinaries(t)
	var authorized, refused atomic.Int64
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server {
		s := mcp.NewServer(&mcp.Implementation{Name: "tracker", Version: "1"}, nil)
		mcp.AddTool(s, &mcp.Tool{Name: "get_issue", Description: "Get an issue."}, func(_ context.Context, _ *mcp.CallToolRequest, in struct {
			ID string `json:"id"`
		}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "issue " + in.ID + ": login fails"}}}, nil, nil
		})
		return s
	}, nil)
	tracker := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Tracker-Key") != trackerTestKey {
			refused.Add(1)
			http.Error(w, "missing or wrong X-Tracker-Key", http.StatusUnauthorized)
			return
		}
		authorized.Add(1)
		handler.ServeHTTP(w, r)
	}))
	tracker.Config.ErrorLog = log.New(io.Discard, "", 0)
	tracker.StartTLS() // its certificate names 127.0.0.1
	t.Cleanup(tracker.Close)
	_, port, _ := net.SplitHostPort(tracker.Listener.Addr().String())
	caFile := filepath.Join(sharedStateDir(t), "upstream-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tracker.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}

	path := filepath.Join(t.TempDir(), "berth.toml")
	toml := fmt.Sprintf(`
[scheduler]
agent_binary = %q
egress_binary = %q
egress_user = "daemon"
run_as = "nobody"

[[egress.secrets]]
name   = "tracker"
env    = "TRACKER_KEY"
hosts  = ["127.0.0.1"]
ports  = [%s]
header = "X-Tracker-Key"
format = "{}"
paths  = ["/mcp"]

[[agents]]
id = "alpha"
provider = "local"
workspace_quota = "0"
[agents.egress]
allow = ["127.0.0.1:%s"]
[[agents.mcp]]
name           = "tracker"
url            = "https://127.0.0.1:%s/mcp"
headers_secret = "tracker"
timeout        = "20s"
`, berthAgent(t), proxyBin, port, port, port)
	if err := os.WriteFile(path, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	backend := &recordingBackend{Backend: landlock.New()}
	s, err := New(cfg, sharedStateDir(t), Options{
		Backends: map[string]isolation.Backend{landlock.Name: backend},
		Getenv: func(k string) string {
			return map[string]string{"TRACKER_KEY": trackerTestKey, "SSL_CERT_FILE": caFile}[k]
		},
		Logger: quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	start(t, s)

	id := submit(t, s, "m1", "alpha", "text", `/tool mcp__tracker__get_issue {"id":"7"}`)
	r := waitFinished(t, s, id)
	if r.State != StateSucceeded || r.Reply != "[mcp__tracker__get_issue]\nissue 7: login fails" {
		t.Fatalf("run %s %s (%s): reply %q, error %q, MCP %+v, stderr %q", r.ID, r.State, r.Reason, r.Reply, r.Error, r.MCP, r.StderrTail)
	}
	if len(r.MCP) != 1 || r.MCP[0].Transport != "http" || r.MCP[0].Error != "" {
		t.Errorf("the record's MCP servers = %+v, want tracker over http without error", r.MCP)
	}
	if authorized.Load() == 0 || refused.Load() != 0 {
		t.Errorf("the server saw %d requests with its header and %d without; want all with it", authorized.Load(), refused.Load())
	}
	if !slices.ContainsFunc(r.Egress, func(d isolation.EgressDecision) bool { return d.Allowed && d.Rule == "secret tracker" }) {
		t.Errorf("the run's egress shows no request under the tracker's secret: %+v", r.Egress)
	}
	backend.mu.Lock()
	defer backend.mu.Unlock()
	if len(backend.requests) != 1 || !strings.Contains(backend.requests[0], `"url":"https://127.0.0.1:`+port+`/mcp"`) {
		t.Fatalf("requests = %q, want one naming the server", backend.requests)
	}
	if strings.Contains(backend.requests[0], trackerTestKey) || strings.Contains(r.StderrTail+r.Reply, trackerTestKey) {
		t.Error("the header's value reached the sandbox")
	}
}

const braveTestKey = "brave-key-SECRET-0123456789"

// [agents.web_search] with provider brave gives a real run the web_search
// tool: its search reaches the (fake) Brave API through the run's proxy,
// which adds the key from the named secret as X-Subscription-Token.
func TestAWebSearchOfARealRunGetsItsKeyFromTheRunsProxy(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	_, proxyBin := egressBinaries(t)
	var keys []string
	var mu sync.Mutex
	brave := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("X-Subscription-Token"))
		mu.Unlock()
		if r.Header.Get("X-Subscription-Token") != braveTestKey || r.URL.Path != "/res/v1/web/search" {
			http.Error(w, `{"type":"ErrorResponse"}`, http.StatusUnauthorized)
			return
		}
		io.WriteString(w, `{"type":"search","web":{"results":[{"title":"<b>berth</b> docs","url":"https://berth.example/docs","description":"for `+r.URL.Query().Get("q")+`"}]}}`)
	}))
	brave.Config.ErrorLog = log.New(io.Discard, "", 0)
	brave.StartTLS()
	t.Cleanup(brave.Close)
	_, port, _ := net.SplitHostPort(brave.Listener.Addr().String())
	caFile := filepath.Join(sharedStateDir(t), "upstream-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: brave.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}

	path := filepath.Join(t.TempDir(), "berth.toml")
	toml := fmt.Sprintf(`
[scheduler]
agent_binary = %q
egress_binary = %q
egress_user = "daemon"
run_as = "nobody"

[[egress.secrets]]
name    = "brave"
env     = "BRAVE_API_KEY"
hosts   = ["127.0.0.1"]
header  = "X-Subscription-Token"
format  = "{}"
methods = ["GET"]
paths   = ["/res/v1/web/search"]

[[agents]]
id = "alpha"
provider = "local"
workspace_quota = "0"
[agents.egress]
allow = ["127.0.0.1:%s"]
[agents.web_search]
provider = "brave"
base_url = "https://127.0.0.1:%s"
secret   = "brave"
`, berthAgent(t), proxyBin, port, port)
	if err := os.WriteFile(path, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, sharedStateDir(t), Options{
		Backends: map[string]isolation.Backend{landlock.Name: landlock.New()},
		Getenv: func(k string) string {
			return map[string]string{"BRAVE_API_KEY": braveTestKey, "SSL_CERT_FILE": caFile}[k]
		},
		Logger: quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	start(t, s)

	id := submit(t, s, "m1", "alpha", "text", `/tool web_search {"query":"sandboxes"}`)
	r := waitFinished(t, s, id)
	want := `[web_search]` + "\n" + `{"results":[{"title":"berth docs","url":"https://berth.example/docs","snippet":"for sandboxes"}]}`
	if r.State != StateSucceeded || r.Reply != want {
		t.Fatalf("run %s %s (%s): reply %q, want %q; error %q, stderr %q", r.ID, r.State, r.Reason, r.Reply, want, r.Error, r.StderrTail)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 1 || keys[0] != braveTestKey {
		t.Errorf("the search API saw keys %q, want the secret once", keys)
	}
	if strings.Contains(r.StderrTail+r.Reply, braveTestKey) {
		t.Error("the key reached the sandbox's output")
	}
}
