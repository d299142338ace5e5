package agent_test

import (
	"bufio"
	"encoding/json"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// serveSession is berth-agent in serve mode with its request and response
// lines at hand.
type serveSession struct {
	cmd *exec.Cmd
	in  *json.Encoder
	out *bufio.Scanner
}

func startServe(t *testing.T, attr *syscall.SysProcAttr) serveSession {
	t.Helper()
	cmd := exec.Command(agentBinary, agentproto.ServeArg)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = attr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("stderr:\n%s", stderr.String())
		}
	})
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	return serveSession{cmd: cmd, in: json.NewEncoder(stdin), out: sc}
}

func (s serveSession) ask(t *testing.T, req agentproto.Request) agentproto.Response {
	t.Helper()
	if err := s.in.Encode(req); err != nil {
		t.Fatalf("cannot send request %s: %v", req.RunID, err)
	}
	if !s.out.Scan() {
		t.Fatalf("no answer to %s: %v", req.RunID, s.out.Err())
	}
	var resp agentproto.Response
	if err := json.Unmarshal(s.out.Bytes(), &resp); err != nil {
		t.Fatalf("answer to %s is not a response: %v\n%s", req.RunID, err, s.out.Text())
	}
	return resp
}

// In serve mode berth-agent confines itself once, at the opening request
// (answered empty), then runs one request per line in that confinement; a
// request that asks for another policy or workspace is refused, not run.
func TestServeModeRunsRequestsInTheConfinementItOpenedWith(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := startServe(t, nil)

	open := f.request("")
	open.RunID = "sandbox-1"
	if resp := s.ask(t, open); resp.RunID != "sandbox-1" || resp.Reply != "" || resp.Error != "" {
		t.Fatalf("opening answer = %+v, want an empty response of sandbox-1", resp)
	}

	first := f.request("/sh echo one > one.txt; cat " + f.config + " 2>&1; echo done")
	first.RunID = "run-1"
	resp := s.ask(t, first)
	if resp.RunID != "run-1" || !strings.Contains(resp.Reply, "done") || strings.Contains(resp.Reply, "config-secret") {
		t.Errorf("first run answered %+v; want it run, confined (the config outside the policy unreadable)", resp)
	}

	wider := f.request("/sh cat " + f.config)
	wider.RunID = "run-2"
	wider.Policy.AllowRead = append(wider.Policy.AllowRead, f.config)
	resp = s.ask(t, wider)
	if resp.RunID != "run-2" || !strings.Contains(resp.Error, "policy is not the sandbox's") || strings.Contains(resp.Reply, "$ cat") {
		t.Errorf("a request with a wider policy was answered %+v; want it refused", resp)
	}

	elsewhere := f.request("/sh echo hi")
	elsewhere.RunID, elsewhere.Workspace = "run-3", f.sibling
	if resp := s.ask(t, elsewhere); !strings.Contains(resp.Error, "workspace") {
		t.Errorf("a request for another workspace was answered %+v; want it refused", resp)
	}

	again := f.request("/sh cat one.txt")
	again.RunID = "run-4"
	if resp := s.ask(t, again); !strings.Contains(resp.Reply, "one") {
		t.Errorf("the sandbox no longer serves after a refusal: %+v", resp)
	}
}

// A kept sandbox's egress proxy is bound once, at the opening, and serves
// every later request: each reaches the model through it with the key the
// scheduler's proxy adds, under the one token of the sandbox.
func TestServeModeServesItsEgressProxyToEveryRequest(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	testenv.NeedRoot(t)
	root := users(t)[1]
	model := newFakeOpenAI(t, shellModel)
	f := openFixture(t, root)
	egress := startEgressRun(t, f, model, root)
	s := startServe(t, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET})

	open := egress.request(f, "")
	open.RunID = "sandbox-1"
	if resp := s.ask(t, open); resp.RunID != "sandbox-1" || resp.Error != "" {
		t.Fatalf("opening answer = %+v, want an empty response of sandbox-1", resp)
	}
	for i, text := range []string{"echo first", "echo second"} {
		req := egress.request(f, text)
		req.RunID = "run-" + text
		resp := s.ask(t, req)
		if resp.Error != "" || !strings.Contains(resp.Reply, "the tool said:") || !strings.Contains(resp.Reply, text[5:]) {
			t.Errorf("request %d answered %+v; want the model reached through the sandbox's proxy", i+1, resp)
		}
	}
	reqs := model.requests()
	if len(reqs) != 4 {
		t.Fatalf("the model got %d requests, want 4 (a call and a tool result per request)", len(reqs))
	}
	for _, r := range reqs {
		if r.Auth != "Bearer "+providerKey {
			t.Errorf("the model got Authorization %q, want the key the proxy adds", r.Auth)
		}
	}
	if n := len(egress.decisions.all()); n < 4 {
		t.Errorf("the scheduler's proxy streamed %d decisions, want one per model call (4)", n)
	}
}
