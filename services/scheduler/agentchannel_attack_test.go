package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
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
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
	"github.com/berth-dev/berth/isolation/landlock"
)

// The walls around berth-agent's own egress channel
// (docs/adr/0026-agent-own-egress-channel.md), attacked through real runs
// on both backends: a tool (agent/testdata/channelprobe, run by the shell
// tool) aims at the web_search provider's and the HTTP MCP server's hosts
// directly, through HTTP_PROXY, with CONNECT and with forged tokens, then
// reads everything it can for the agent token and the run's secrets. The
// controls: the model's own web_search and MCP calls get through with the
// secret; with the agent token planted in the workspace (the token's wall
// off) the same probe gets through with the secret and its search finds
// the token; with an admin's allow rule for the hosts (the rule's wall
// off) its CONNECT reaches them, without the secret.

const (
	wallSearchKey  = "brave-key-WALL-5e1d0c9b7a64"
	wallTrackerKey = "tracker-key-WALL-83f2aa61c0"
)

// channelProbeBinary is agent/testdata/channelprobe, static.
var channelProbeBinary = sync.OnceValues(func() ([]byte, error) {
	dir, err := os.MkdirTemp("", "berth-channelprobe-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin, err := testenv.BuildStatic(dir, "channelprobe", "../../agent/testdata/channelprobe")
	if err != nil {
		return nil, err
	}
	return os.ReadFile(bin)
})

// wallTarget is a TLS server that wants its header and records every
// request it sees, and every TLS handshake that failed.
type wallTarget struct {
	srv      *httptest.Server
	hostPort string
	port     string
	mu       sync.Mutex
	seen     []seenRequest
	badTLS   atomic.Int64
}

type seenRequest struct{ mark, key, method, path string }

type lineCounter func(p []byte)

func (l lineCounter) Write(p []byte) (int, error) { l(p); return len(p), nil }

func newWallTarget(t *testing.T, header, key string, h http.Handler) *wallTarget {
	w := &wallTarget{}
	w.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		w.seen = append(w.seen, seenRequest{mark: r.URL.Query().Get("atk"), key: r.Header.Get(header), method: r.Method, path: r.URL.Path})
		w.mu.Unlock()
		if r.Header.Get(header) != key {
			http.Error(rw, "missing or wrong "+header, http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(rw, r)
	}))
	w.srv.Config.ErrorLog = log.New(lineCounter(func(p []byte) {
		if bytes.Contains(p, []byte("TLS handshake error")) {
			w.badTLS.Add(1)
		}
	}), "", 0)
	w.srv.StartTLS() // httptest's certificate, for 127.0.0.1
	t.Cleanup(w.srv.Close)
	w.hostPort = w.srv.Listener.Addr().String()
	_, w.port, _ = net.SplitHostPort(w.hostPort)
	return w
}

// requests are the requests seen so far whose mark starts with prefix
// ("" for every request).
func (w *wallTarget) requests(prefix string) []seenRequest {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []seenRequest
	for _, s := range w.seen {
		if strings.HasPrefix(s.mark, prefix) {
			out = append(out, s)
		}
	}
	return out
}

// channelBackend puts the probe into each run's workspace before the run
// and keeps each run's egress (its tokens); with plant set it also writes
// the run's agent token into the workspace: the token's wall, off.
type channelBackend struct {
	isolation.Backend
	probe []byte
	plant atomic.Bool
	mu    sync.Mutex
	runs  []seenRun
}

// seenRun is what the backend saw of a run: its egress and its workspace.
type seenRun struct {
	egress    agentproto.Egress
	workspace string
}

func (b *channelBackend) Run(ctx context.Context, spec isolation.Spec) (isolation.Result, error) {
	data, err := spec.Input()
	if err != nil {
		return isolation.Result{}, err
	}
	var req agentproto.Request
	if err := json.Unmarshal(data, &req); err != nil || req.Egress == nil || req.Egress.AgentToken == "" {
		return isolation.Result{}, fmt.Errorf("the run's request has no agent token: %v", err)
	}
	ws := spec.Plan.Workspace
	b.mu.Lock()
	b.runs = append(b.runs, seenRun{*req.Egress, ws})
	b.mu.Unlock()
	fi, err := os.Stat(ws)
	if err != nil {
		return isolation.Result{}, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	put := func(name string, data []byte, mode os.FileMode) error {
		p := filepath.Join(ws, name)
		os.Remove(p)
		if err := os.WriteFile(p, data, mode); err != nil {
			return err
		}
		return os.Chown(p, int(st.Uid), int(st.Gid))
	}
	for _, name := range []string{"channelprobe-result.json", "channelprobe-loot", "planted-agent-token"} {
		os.Remove(filepath.Join(ws, name))
	}
	if err := put("channelprobe", b.probe, 0o755); err != nil {
		return isolation.Result{}, err
	}
	if b.plant.Load() {
		if err := put("planted-agent-token", []byte(req.Egress.AgentToken), 0o600); err != nil {
			return isolation.Result{}, err
		}
	}
	return b.Backend.Run(ctx, spec)
}

func (b *channelBackend) last() seenRun {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runs[len(b.runs)-1]
}

// probeReport is the probe's result file (its Report type).
type probeReport struct {
	Socket string `json:"socket"`
	Cases  []struct {
		Name        string `json:"name"`
		Target      string `json:"target"`
		Dialled     string `json:"dialled"`
		Err         string `json:"err"`
		Status      int    `json:"status"`
		Egress      string `json:"egress"`
		Body        string `json:"body"`
		InnerStatus int    `json:"inner_status"`
		InnerBody   string `json:"inner_body"`
	} `json:"cases"`
	Loot struct {
		Pids     []int    `json:"pids"`
		Read     []string `json:"read"`
		Refused  []string `json:"refused"`
		Bytes    int      `json:"bytes"`
		MemPages int      `json:"mem_pages"`
	} `json:"loot"`
	Planted bool `json:"planted"`
}

func TestTheAgentsOwnChannelHoldsAgainstToolsOnLandlockRuns(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	attackAgentChannel(t, landlock.New(), "")
}

func TestTheAgentsOwnChannelHoldsAgainstToolsOnContainerRuns(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	cli := testdocker.Engine(t)
	stateDir := sharedStateDir(t)
	boxes, err := container.New(container.Options{Client: cli, Instance: stateDir, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	attackAgentChannel(t, boxes, "[agents.container_mode]\nenabled = true\nnetwork = \"none\"\n")
}

func attackAgentChannel(t *testing.T, inner isolation.Backend, box string) {
	_, proxyBin := egressBinaries(t)
	probe, err := channelProbeBinary()
	if err != nil {
		t.Fatalf("cannot build the probe: %v", err)
	}
	search := newWallTarget(t, "X-Subscription-Token", wallSearchKey, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"type":"search","web":{"results":[{"title":"walls","url":"https://berth.example/walls","description":"for `+r.URL.Query().Get("q")+`"}]}}`)
	}))
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server {
		s := mcp.NewServer(&mcp.Implementation{Name: "tracker", Version: "1"}, nil)
		mcp.AddTool(s, &mcp.Tool{Name: "get_issue", Description: "Get an issue."}, func(_ context.Context, _ *mcp.CallToolRequest, in struct {
			ID string `json:"id"`
		}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "issue " + in.ID + ": login fails"}}}, nil, nil
		})
		s.AddResource(&mcp.Resource{URI: "tracker://open", Name: "open"}, func(_ context.Context, r *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: r.Params.URI, Text: "7 open issues"}}}, nil
		})
		return s
	}, nil)
	tracker := newWallTarget(t, "X-Tracker-Key", wallTrackerKey, mcpHandler)
	stateDir := sharedStateDir(t)
	caFile := filepath.Join(stateDir, "upstream-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: search.srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}

	agentTools := fmt.Sprintf(`[agents.web_search]
provider = "brave"
base_url = "https://127.0.0.1:%s"
secret   = "brave"
[[agents.mcp]]
name           = "tracker"
url            = "https://127.0.0.1:%s/mcp"
headers_secret = "tracker"
timeout        = "20s"
`, search.port, tracker.port)
	path := filepath.Join(t.TempDir(), "berth.toml")
	toml := fmt.Sprintf(`
[scheduler]
agent_binary = %q
egress_binary = %q
egress_user = "daemon"
run_as = "nobody"
default_timeout_seconds = 240

[[egress.secrets]]
name    = "brave"
env     = "BRAVE_API_KEY"
hosts   = ["127.0.0.1"]
ports   = [%s]
header  = "X-Subscription-Token"
format  = "{}"
methods = ["GET"]
paths   = ["/res/v1/web/search"]

[[egress.secrets]]
name   = "tracker"
env    = "TRACKER_KEY"
hosts  = ["127.0.0.1"]
ports  = [%s]
header = "X-Tracker-Key"
format = "{}"
paths  = ["/mcp"]

[[agents]]
id = "wall"
provider = "local"
workspace_quota = "0"
%s%s
[[agents]]
id = "open"
provider = "local"
workspace_quota = "0"
%s%s
[agents.egress]
allow = ["127.0.0.1:%s", "127.0.0.1:%s"]
`, berthAgent(t), proxyBin, search.port, tracker.port, box, agentTools, box, agentTools, search.port, tracker.port)
	if err := os.WriteFile(path, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	backend := &channelBackend{Backend: inner, probe: probe}
	s, err := New(cfg, stateDir, Options{
		Backends: map[string]isolation.Backend{inner.Name(): backend},
		Getenv: func(k string) string {
			return map[string]string{"BRAVE_API_KEY": wallSearchKey, "TRACKER_KEY": wallTrackerKey, "SSL_CERT_FILE": caFile}[k]
		},
		Logger: quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	start(t, s)

	targets := fmt.Sprintf("127.0.0.1:%s/res/v1/web/search 127.0.0.1:%s/mcp", search.port, tracker.port)
	n := 0
	run := func(agent, text string) (Run, seenRun) {
		t.Helper()
		n++
		id := submit(t, s, fmt.Sprintf("m%d", n), agent, "text", text)
		r := waitFinishedWithin(t, s, id, 4*time.Minute)
		if r.State != StateSucceeded {
			t.Fatalf("run %s %s (%s): reply %q, error %q, stderr %q", r.ID, r.State, r.Reason, r.Reply, r.Error, r.StderrTail)
		}
		return r, backend.last()
	}
	report := func(r Run, seen seenRun) (probeReport, string) {
		t.Helper()
		ws := seen.workspace
		data, err := os.ReadFile(filepath.Join(ws, "channelprobe-result.json"))
		if err != nil {
			t.Fatalf("the probe left no result (reply %q, stderr %q): %v", r.Reply, r.StderrTail, err)
		}
		var rep probeReport
		if err := json.Unmarshal(data, &rep); err != nil {
			t.Fatal(err)
		}
		loot, err := os.ReadFile(filepath.Join(ws, "channelprobe-loot"))
		if err != nil {
			t.Fatal(err)
		}
		return rep, string(data) + string(loot) + r.Reply + r.StderrTail + string(r.ToolCalls)
	}
	secrets := []string{wallSearchKey, wallTrackerKey}

	// The attack, every wall on.
	r, sr := run("wall", "/sh ./channelprobe wall "+targets)
	rep, seen := report(r, sr)
	eg := sr.egress
	t.Run("Attack", func(t *testing.T) {
		if rep.Socket == "" {
			t.Error("the probe found no run socket to aim at")
		}
		byKind := map[string]int{}
		for _, c := range rep.Cases {
			kind := strings.TrimPrefix(c.Name, "wall-")
			kind = kind[:strings.LastIndex(kind, "-127.0.0.1:")]
			byKind[kind]++
			forTool := "web_search"
			if strings.HasSuffix(c.Target, ":"+tracker.port) {
				forTool = "MCP server tracker"
			}
			switch {
			case c.InnerStatus != 0:
				t.Errorf("GOT THROUGH: %s opened a tunnel and the target answered %d %q", c.Name, c.InnerStatus, c.InnerBody)
			case kind == "direct":
				if c.Dialled != "" || c.Err == "" {
					t.Errorf("GOT THROUGH: %s connected to the target directly: %+v", c.Name, c)
				}
			case strings.HasPrefix(kind, "socket-"):
				if c.Status != http.StatusProxyAuthRequired || c.Egress != "refused" || !strings.Contains(c.Body, "no valid token") {
					t.Errorf("%s: answer %d %q %q, want the proxy's 407", c.Name, c.Status, c.Egress, c.Body)
				}
			case strings.HasPrefix(kind, "proxy-get"):
				// A plain-HTTP GET of an https host: no rule on either channel.
				if c.Status != http.StatusForbidden || c.Egress != "refused" || !strings.Contains(c.Body, "berth egress refused") {
					t.Errorf("%s: answer %d %q %q, want the proxy's 403", c.Name, c.Status, c.Egress, c.Body)
				}
			default: // CONNECT through HTTP_PROXY, with or without a forged token
				if c.Status != http.StatusForbidden || c.Egress != "refused" || !strings.Contains(c.Body, "berth-agent's own "+forTool+" only") {
					t.Errorf("%s: answer %d %q %q, want the proxy's 403 naming %s", c.Name, c.Status, c.Egress, c.Body, forTool)
				}
			}
		}
		for _, kind := range []string{"direct", "proxy-get", "proxy-connect", "proxy-forged-0", "proxy-get-forged-0", "socket-no-token", "socket-forged-0", "socket-get-forged-0"} {
			if byKind[kind] != 2 {
				t.Errorf("the probe ran %d cases %s, want one per target: %v", byKind[kind], kind, byKind)
			}
		}
		for _, w := range []*wallTarget{search, tracker} {
			if got := w.requests("wall-"); len(got) > 0 {
				t.Errorf("GOT THROUGH: %s saw the probe's requests %+v", w.hostPort, got)
			}
			for _, got := range w.requests("") {
				if got.key == "" {
					t.Errorf("GOT THROUGH: %s saw a request without its header: %+v", w.hostPort, got)
				}
			}
			if n := w.badTLS.Load(); n > 0 {
				t.Errorf("GOT THROUGH: %s saw %d connections that were not TLS", w.hostPort, n)
			}
		}
		for _, want := range []string{"for berth-agent's own web_search only", "for berth-agent's own MCP server tracker only", "no valid token"} {
			if !slices.ContainsFunc(r.Egress, func(d isolation.EgressDecision) bool { return !d.Allowed && strings.Contains(d.Reason, want) }) {
				t.Errorf("the run's record has no refusal %q: %+v", want, r.Egress)
			}
		}
	})
	t.Run("ToolsFindNoTokenNorSecret", func(t *testing.T) {
		for what, needle := range map[string]string{"the agent token": eg.AgentToken, "the run token": eg.Token, "the search key": wallSearchKey, "the tracker key": wallTrackerKey} {
			if strings.Contains(seen, needle) {
				i := strings.Index(seen, needle)
				t.Errorf("FOUND %s in what the tool read: …%s…", what, seen[max(0, i-200):i])
			}
		}
		// It read its environment and tried every process's memory it could
		// name (a host run's tools may not even list /proc).
		tried := append(slices.Clone(rep.Loot.Read), rep.Loot.Refused...)
		if !slices.Contains(rep.Loot.Read, "env") || !slices.ContainsFunc(tried, func(p string) bool { return strings.Contains(p, "/mem") }) {
			t.Errorf("the probe did not read its environment or try any /proc/*/mem: read %v, refused %v", rep.Loot.Read, rep.Loot.Refused)
		}
		t.Logf("the probe read %d bytes from %d places (%d pages of memory), was refused %d: %v", rep.Loot.Bytes, len(rep.Loot.Read), rep.Loot.MemPages, len(rep.Loot.Refused), rep.Loot.Refused)
	})

	// The controls: the model's own calls, on berth-agent's own channel.
	t.Run("ControlWebSearch", func(t *testing.T) {
		before := len(search.requests(""))
		r, _ := run("wall", `/tool web_search {"query":"walls"}`)
		want := "[web_search]\n" + `{"results":[{"title":"walls","url":"https://berth.example/walls","snippet":"for walls"}]}`
		if r.Reply != want {
			t.Errorf("reply %q, want %q", r.Reply, want)
		}
		got := search.requests("")[before:]
		if len(got) != 1 || got[0].key != wallSearchKey {
			t.Errorf("the search API saw %+v, want one request with its key", got)
		}
		if !slices.ContainsFunc(r.Egress, func(d isolation.EgressDecision) bool { return d.Allowed && d.Rule == "secret brave" }) {
			t.Errorf("the record shows no request under the secret brave: %+v", r.Egress)
		}
	})
	t.Run("ControlMCP", func(t *testing.T) {
		before := len(tracker.requests(""))
		r, _ := run("wall", `/tool mcp__tracker__get_issue {"id":"7"}`)
		if r.Reply != "[mcp__tracker__get_issue]\nissue 7: login fails" {
			t.Errorf("reply %q, want the server's answer", r.Reply)
		}
		got := tracker.requests("")[before:]
		if len(got) == 0 || slices.ContainsFunc(got, func(s seenRequest) bool { return s.key != wallTrackerKey }) {
			t.Errorf("the MCP server saw %+v, want its header on every request", got)
		}
	})

	// A resource of the server's, read the same way.
	t.Run("ControlMCPResource", func(t *testing.T) {
		before := len(tracker.requests(""))
		r, _ := run("wall", `/tool mcp__tracker__read_resource {"uri":"tracker://open"}`)
		if r.Reply != "[mcp__tracker__read_resource]\n7 open issues" {
			t.Errorf("reply %q, want the resource's text", r.Reply)
		}
		if got := tracker.requests("")[before:]; len(got) == 0 || slices.ContainsFunc(got, func(s seenRequest) bool { return s.key != wallTrackerKey }) {
			t.Errorf("the MCP server saw %+v, want its header on every request", got)
		}
	})

	// The token's wall off: the run's agent token in the workspace.
	t.Run("ControlPlantedToken", func(t *testing.T) {
		backend.plant.Store(true)
		defer backend.plant.Store(false)
		r, sr := run("wall", "/sh ./channelprobe planted "+targets)
		rep, seen := report(r, sr)
		eg := sr.egress
		if !rep.Planted {
			t.Fatal("the probe did not find the planted token")
		}
		if !strings.Contains(seen, eg.AgentToken) {
			t.Error("the search did not find the planted copy of the agent token: it cannot find one either")
		}
		for _, w := range []*wallTarget{search, tracker} {
			got := w.requests("planted-socket-planted-")
			if len(got) != 1 || got[0].key == "" {
				t.Errorf("with the agent token the probe's request to %s was %+v, want one with the secret added", w.hostPort, got)
			}
			if got := w.requests("planted-"); len(got) != 1 {
				t.Errorf("%s saw more of the probe than the planted token's request: %+v", w.hostPort, got)
			}
		}
		for _, c := range rep.Cases {
			if strings.HasPrefix(c.Name, "planted-socket-planted-") && (c.Status != http.StatusOK || c.InnerStatus != http.StatusOK) {
				t.Errorf("%s: %d then %d %q, want the tunnel and the target's 200", c.Name, c.Status, c.InnerStatus, c.InnerBody)
			}
		}
		for _, k := range secrets {
			if strings.Contains(seen, k) {
				t.Error("a secret reached the tool's output; the proxy adds it upstream only")
			}
		}
	})

	// The rule's wall off: an admin's allow rule lets tools reach the hosts.
	t.Run("ControlAllowRule", func(t *testing.T) {
		rep, seen := report(run("open", "/sh ./channelprobe open "+targets))
		for _, w := range []*wallTarget{search, tracker} {
			got := w.requests("open-proxy-connect-")
			if len(got) != 1 || got[0].key != "" {
				t.Errorf("with an allow rule the probe's CONNECT to %s reached it as %+v, want once, without the secret", w.hostPort, got)
			}
		}
		for _, c := range rep.Cases {
			if strings.HasPrefix(c.Name, "open-proxy-connect-") && (c.Status != http.StatusOK || c.InnerStatus != http.StatusUnauthorized) {
				t.Errorf("%s: %d then %d %q, want the tunnel and the target's 401", c.Name, c.Status, c.InnerStatus, c.InnerBody)
			}
		}
		for _, k := range secrets {
			if strings.Contains(seen, k) {
				t.Error("a secret reached the tool")
			}
		}
	})
}
