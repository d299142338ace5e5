package agent_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/services/egress"
)

const egressToken = "run-token-do-not-leak-0123456789"

// egressRun is a run's egress proxy (services/egress, as the scheduler
// starts it) on a socket the run user may connect to, in front of a fake
// OpenAI server that insists on the real key.
type egressRun struct {
	socket    string
	decisions *streamedDecisions
}

// streamedDecisions are what the proxy streams through OnDecision, as
// berth-egress hands them to the scheduler's record.
type streamedDecisions struct {
	mu  sync.Mutex
	got []isolation.EgressDecision
}

func (s *streamedDecisions) add(d isolation.EgressDecision) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, d)
}

func (s *streamedDecisions) all() []isolation.EgressDecision {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]isolation.EgressDecision(nil), s.got...)
}

func startEgressRun(t *testing.T, f fixture, model *fakeOpenAI, as runAs) egressRun {
	t.Helper()
	decisions := &streamedDecisions{}
	srv, err := egress.NewServer(egress.Policy{RunID: "run-1", Agent: "alpha", Token: egressToken,
		Providers: []egress.Provider{{Name: "fake", Kind: "openai", BaseURL: model.srv.URL + "/v1", Model: "gpt-test", Key: providerKey}}},
		egress.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), OnDecision: decisions.add})
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(f.root, "egress.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(socket, as.uid, as.gid); err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return egressRun{socket: socket, decisions: decisions}
}

// request is what the scheduler hands an agent without a network of its
// own: no key, the provider behind the in-sandbox proxy, TCP only to it.
func (e egressRun) request(f fixture, text string) agentproto.Request {
	req := f.hostRequest(text)
	req.Provider = agentproto.Provider{Name: "fake", Kind: "openai", Model: "gpt-test", Proxied: true,
		BaseURL: isolation.ProviderProxyURL("127.0.0.1:3128", "fake"), Endpoint: "http://model.test/v1"}
	req.Policy.Network = false
	req.Policy.ConnectPorts = []uint16{isolation.EgressProxyPort}
	req.Egress = &agentproto.Egress{ProxyAddr: "127.0.0.1:3128", Socket: e.socket, Token: egressToken}
	return req
}

// runInNamespace runs berth-agent as the scheduler's host runner would:
// as the run user, in a network namespace of its own (attr adds to that).
func runInNamespace(t *testing.T, req agentproto.Request, as runAs, attr *syscall.SysProcAttr) result {
	t.Helper()
	stdin, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(agentBinary)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	attr.Credential = &syscall.Credential{Uid: uint32(as.uid), Gid: uint32(as.gid)}
	attr.Cloneflags |= syscall.CLONE_NEWNET
	cmd.SysProcAttr = attr
	err = cmd.Run()
	res := result{stdout: stdout.String(), stderr: stderr.String()}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		res.code = exitErr.ExitCode()
	} else if err != nil {
		t.Fatalf("cannot run berth-agent: %v", err)
	}
	if res.stdout != "" {
		if err := json.Unmarshal(stdout.Bytes(), &res.resp); err != nil {
			t.Fatalf("stdout is not a response: %v\n%s\nstderr: %s", err, res.stdout, res.stderr)
		}
	}
	for _, secret := range []string{providerKey, egressToken} {
		if strings.Contains(res.stdout+res.stderr, secret) {
			t.Errorf("a secret (%.6s…) leaked into stdout or stderr:\n%s\n%s", secret, res.stdout, res.stderr)
		}
	}
	return res
}

// A shell tool call for the message text, then the tool's output as the reply.
func shellModel(r oaRequest) (int, string) {
	if role, out := r.last(); role == "tool" {
		return oaText("the tool said: " + out)
	}
	_, text := r.last()
	return oaCall("call_1", "shell", map[string]string{"command": text})
}

func TestAnAgentWithoutANetworkReachesItsProviderAndOnlyAllowedHostsThroughTheEgressProxy(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	testenv.NeedRoot(t)
	nobody, root := users(t)[0], users(t)[1]
	inOwnUserNamespace := func(as runAs, caps ...uintptr) *syscall.SysProcAttr {
		return &syscall.SysProcAttr{
			Cloneflags:                 syscall.CLONE_NEWUSER,
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: as.uid, HostID: as.uid, Size: 1}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: as.gid, HostID: as.gid, Size: 1}},
			GidMappingsEnableSetgroups: true,
			AmbientCaps:                caps,
		}
	}
	// What a tool sees: its environment, a refused host, and whether it
	// may change its network namespace (CAP_NET_ADMIN).
	const command = "env; curl -s -w ' [%{http_code}]\\n' --max-time 10 http://files.example/x; /usr/sbin/ip link add berth0 type dummy; echo ip exit $?"

	tests := []struct {
		name   string
		as     runAs
		attr   *syscall.SysProcAttr
		code   int
		has    []string // in the reply (exit 0) or stderr (refused)
		called bool     // the model was reached
	}{
		{
			// A root scheduler's namespace (or a rootful runner): the agent
			// raises the down loopback itself before it confines itself.
			name: "A_root_agent_in_an_empty_network_namespace_brings_its_loopback_up",
			as:   root, attr: &syscall.SysProcAttr{}, code: agentproto.ExitOK, called: true,
			has: []string{"HTTP_PROXY=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128", "NO_PROXY=localhost,127.0.0.1,::1",
				"no [agents.egress] allow rule matches GET files.example:80", "[403]"},
		},
		{
			// A scheduler that is neither root nor under systemd: a user
			// namespace around the network one; given CAP_NET_ADMIN there,
			// the agent raises the loopback and drops it before any tool runs.
			name: "A_non_root_agent_in_its_own_user_namespace_brings_its_loopback_up_and_its_tools_hold_no_capability",
			as:   nobody, attr: inOwnUserNamespace(nobody, unix.CAP_NET_ADMIN), code: agentproto.ExitOK, called: true,
			has: []string{"HTTP_PROXY=http://127.0.0.1:3128", "Operation not permitted", "ip exit 2",
				"no [agents.egress] allow rule matches GET files.example:80", "[403]"},
		},
		{
			name: "A_non_root_agent_that_cannot_bring_its_loopback_up_is_refused_before_anything_runs",
			as:   nobody, attr: inOwnUserNamespace(nobody), code: agentproto.ExitConfinement,
			has: []string{"refusing to run: no way out through the egress proxy", "cannot bring up the sandbox's loopback"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, err := exec.LookPath("curl"); err != nil {
				testenv.Need(t, false, "curl is not installed")
			}
			model := newFakeOpenAI(t, shellModel)
			f := openFixture(t, tt.as)
			run := startEgressRun(t, f, model, tt.as)
			res := runInNamespace(t, run.request(f, command), tt.as, tt.attr)
			if res.code != tt.code {
				t.Fatalf("exit code = %d, want %d\nstdout: %s\nstderr: %s", res.code, tt.code, res.stdout, res.stderr)
			}
			got := res.resp.Reply
			if tt.code != agentproto.ExitOK {
				got = res.stderr
			}
			for _, want := range tt.has {
				if !strings.Contains(got, want) {
					t.Errorf("lacks %q:\n%s\nstderr: %s", want, got, res.stderr)
				}
			}
			reqs := model.requests()
			if !tt.called {
				if len(reqs) != 0 {
					t.Errorf("a refused agent reached the model %d times", len(reqs))
				}
				return
			}
			if len(reqs) != 2 {
				t.Fatalf("the model got %d requests, want 2 (the call, the tool result)", len(reqs))
			}
			for _, r := range reqs {
				if r.Auth != "Bearer "+providerKey {
					t.Errorf("the model got Authorization %q, want the key the proxy adds", r.Auth)
				}
			}
			// runInNamespace fails the test if the key or the token is in
			// the response (which holds the tool's environment) or the log.
			decisions := run.decisions.all()
			var refused int
			for _, d := range decisions {
				if !d.Allowed && d.Host == "files.example" {
					refused++
				}
			}
			if refused != 1 {
				t.Errorf("the proxy recorded %d refusals of files.example, want 1: %+v", refused, decisions)
			}
		})
	}
}

func TestAnEgressTheAgentCannotServeRefusesTheRun(t *testing.T) {
	t.Parallel()
	model := newFakeOpenAI(t, shellModel)
	f := newFixture(t)
	req := f.request("hello")
	req.Egress = &agentproto.Egress{ProxyAddr: "127.0.0.1:3128", Socket: filepath.Join(f.root, "egress.sock")} // no token
	req.Provider = agentproto.Provider{Name: "fake", Kind: "openai", BaseURL: model.srv.URL + "/v1", Model: "gpt-test", Proxied: true}
	res := runAgent(t, req)
	if res.code != agentproto.ExitConfinement || res.stdout != "" || !strings.Contains(res.stderr, "the request's egress is incomplete") {
		t.Fatalf("exit %d, stdout %q, stderr %s; want %d with the reason and nothing on stdout", res.code, res.stdout, res.stderr, agentproto.ExitConfinement)
	}
	if n := len(model.requests()); n != 0 {
		t.Errorf("a refused run called its model %d times", n)
	}
}
