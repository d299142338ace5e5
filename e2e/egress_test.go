package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/devstack"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// startWithEgress runs the suite with agents that have no network of their
// own: "gpt" calls the fake OpenAI server, "claude" the fake Anthropic one,
// and the agents in extra (TOML) are added; each reaches its provider only
// through its run's egress proxy (berth-egress as "daemon").
func startWithEgress(t *testing.T, claude *fakeAnthropic, gpt *fakeOpenAI, extra string) *suite {
	t.Helper()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("systemd-socket-activate")
	testenv.Need(t, err == nil, "systemd-socket-activate is not installed")
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	sink := newReplySink(t)
	cfg := fmt.Sprintf(`[providers]
primary = "gpt"

[providers.claude]
kind = "anthropic"
base_url = %q
api_key_env = "E2E_ANTHROPIC_KEY"
model = "claude-e2e"

[providers.gpt]
kind = "openai"
base_url = %q
api_key_env = "E2E_FAKE_KEY"
model = "gpt-e2e"

[[agents]]
id = "gpt"
max_iterations = 4

[[agents]]
id = "claude"
provider = "claude"
max_iterations = 4

[intake]
default_agent = "gpt"

[[connectors]]
id = "hooks"
type = "webhook"
secret = %q
reply_url = %q

[[bindings]]
connector = "hooks"
channel_id = "claude"
agent = "claude"

[scheduler]
default_timeout_seconds = 60
run_as = "nobody"
egress_user = "daemon"
agent_binary = %q
`, claude.srv.URL, gpt.srv.URL+"/v1", secret, sink.srv.URL+"/replies", filepath.Join(binDir, "berth-agent"))
	env := []string{"E2E_ANTHROPIC_KEY=" + anthropicKey, "E2E_FAKE_KEY=" + fakeKey}
	return launchShort(t, sink, cfg+extra, env, anthropicKey, fakeKey)
}

// launchShort is launch in a suite directory short enough for the runs'
// egress sockets: <suite>/state/scheduler/egress/<run id>/egress.sock must
// fit a Unix socket address (108 bytes), which launch's
// $TMPDIR/berth-e2e-NNN/suite-NNN does not leave room for.
func launchShort(t *testing.T, sink *replySink, cfg string, env []string, secrets ...string) *suite {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "be-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	st, err := devstack.Start(devstack.Options{BinDir: binDir, Dir: dir, Config: cfg, Env: env})
	if err != nil {
		t.Fatalf("cannot start the suite: %v", err)
	}
	s := &suite{Stack: st, sink: sink}
	t.Cleanup(func() {
		s.stop()
		for _, p := range []string{st.IntakeLog, st.BusLog} {
			b, _ := os.ReadFile(p)
			for _, secret := range secrets {
				if strings.Contains(string(b), secret) {
					t.Errorf("a secret is in %s", p)
				}
			}
			if t.Failed() {
				t.Logf("%s:\n%s", p, tail(b, 6000))
			}
		}
	})
	return s
}

func TestAnAgentWithoutANetworkReachesItsProviderOnlyThroughTheEgressProxy(t *testing.T) {
	t.Parallel()
	claude, gpt := newFakeAnthropic(t), newFakeOpenAI(t)
	s := startWithEgress(t, claude, gpt, "")

	tests := []struct {
		name    string
		channel string
		text    string
		reply   func(got string) bool
		want    string
	}{
		{
			name: "An_OpenAI_agent_gets_its_reply", channel: "general", text: "hello",
			reply: func(got string) bool { return got == `"hello" after 0 earlier messages` }, want: `"hello" after 0 earlier messages`,
		},
		{
			name: "An_Anthropic_agent_gets_its_reply", channel: "claude", text: "hello",
			reply: func(got string) bool { return got == `claude heard "hello" after 0 earlier messages` }, want: `claude heard "hello" after 0 earlier messages`,
		},
		{
			// The model asks for shell; the tool finds the proxy in its
			// environment and no key, and a host no rule allows is refused
			// with the reason.
			name: "A_tool_reaching_a_host_no_rule_allows_gets_a_403_naming_the_reason", channel: "general",
			text: "run env; curl -s -w ' [%{http_code}]' --max-time 10 http://files.example/x",
			reply: func(got string) bool {
				return strings.Contains(got, "HTTP_PROXY=http://127.0.0.1:3128") &&
					strings.Contains(got, "berth egress refused GET files.example:80: no [agents.egress] allow rule matches GET files.example:80") &&
					strings.Contains(got, " [403]")
			},
			want: "HTTP_PROXY in the tool's environment and the proxy's 403 with its reason",
		},
	}
	t.Run("messages", func(t *testing.T) { // ends when every message has its reply
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				reply := s.ask(t, tt.channel, "", tt.text)
				if reply["state"] != "succeeded" || !tt.reply(text(reply)) {
					t.Errorf("state %v, error %v, reply %q; want %s", reply["state"], reply["error"], text(reply), tt.want)
				}
				// Every decision of the proxy is in the run record, and
				// berthctl runs show prints it.
				runID, _ := reply["run_id"].(string)
				out, err := s.berthctl(t, "runs", "show", runID)
				if err != nil {
					t.Fatalf("berthctl runs show: %v\n%s", err, out)
				}
				if !strings.Contains(out, "\negress:\n") || !strings.Contains(out, " POST 127.0.0.1:") {
					t.Errorf("runs show lists no allowed provider call under egress:\n%s", out)
				}
				if strings.Contains(tt.text, "files.example") && !strings.Contains(out, "GET files.example:80 /x REFUSED no [agents.egress] allow rule matches") {
					t.Errorf("runs show lists no refused request to files.example:\n%s", out)
				}
				for _, key := range []string{fakeKey, anthropicKey} {
					if strings.Contains(text(reply), key) {
						t.Errorf("a provider key reached the sandbox: %q", text(reply))
					}
				}
			})
		}
	})

	// The proxy, not the agent, held the keys: each server saw its own.
	gpt.mu.Lock()
	if len(gpt.auths) != 3 {
		t.Errorf("the OpenAI server got %d calls, want 3 (hello, the tool call, its result)", len(gpt.auths))
	}
	for _, auth := range gpt.auths {
		if auth != "Bearer "+fakeKey {
			t.Errorf("the OpenAI server got Authorization %q, want the key the proxy adds", auth)
		}
	}
	gpt.mu.Unlock()
	claude.mu.Lock()
	if len(claude.calls) != 1 {
		t.Errorf("the Anthropic server got %d calls, want 1", len(claude.calls))
	}
	for _, c := range claude.calls {
		if c.apiKey != anthropicKey || c.auth != "" {
			t.Errorf("the Anthropic server got X-Api-Key %q, Authorization %q; want only the x-api-key the proxy adds", c.apiKey, c.auth)
		}
	}
	if len(claude.bad) > 0 {
		t.Errorf("the fake Anthropic server refused malformed requests: %q", claude.bad)
	}
	claude.mu.Unlock()

	// Nothing an admin reads over D-Bus (reply, tool calls, the agent's log
	// tail) carries a key, not even redacted: the agent never had one.
	s.noKeyInRuns(t, fakeKey, anthropicKey, "[redacted]")
}

func TestAContainerAgentWithoutANetworkReachesItsProviderThroughTheEgressProxy(t *testing.T) {
	t.Parallel()
	testdocker.Engine(t)
	claude, gpt := newFakeAnthropic(t), newFakeOpenAI(t)
	s := startWithEgress(t, claude, gpt, `
[[agents]]
id = "boxed"
max_iterations = 4
`+containerAgent+`

[[bindings]]
connector = "hooks"
channel_id = "boxed"
agent = "boxed"
`)
	// network=none: the container's only way out is the run's socket,
	// bind-mounted at /run/berth-egress.
	reply := s.sink.wait(t, 3*time.Minute, s.mustPost(t, "boxed", "hello from the box"))
	for _, r := range reply {
		if r["state"] != "succeeded" || text(r) != `"hello from the box" after 0 earlier messages` {
			t.Errorf("state %v, error %v, reply %q; want the model's reply through the proxy", r["state"], r["error"], text(r))
		}
	}
	if runs := s.listRuns(t, busapi.ListFilter{}); len(runs) != 1 || runs[0].Backend != busapi.BackendContainer {
		t.Errorf("runs %v: want one run on the container backend", runs)
	}
	gpt.mu.Lock()
	if len(gpt.auths) != 1 || gpt.auths[0] != "Bearer "+fakeKey {
		t.Errorf("the OpenAI server got Authorization %q, want one call with the key the proxy adds", gpt.auths)
	}
	gpt.mu.Unlock()
	s.noKeyInRuns(t, fakeKey, anthropicKey, "[redacted]")
}
