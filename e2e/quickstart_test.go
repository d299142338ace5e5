package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// ranAsAgentUID says reply has marker followed by a uid of the default
// [scheduler] agent_uids (each agent its own uid; agentUIDAfter).
func ranAsAgentUID(reply, marker string) bool {
	_, ok := agentUIDAfter(reply, marker)
	return ok
}

func quickstart(t *testing.T, env []string, args ...string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Join(filepath.Dir(file), "..")
	cmd := exec.Command(filepath.Join(repo, "scripts", "quickstart.sh"), args...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("quickstart %q failed: %v\n%s", args, err, out)
	}
	return string(out)
}

// The README's first command must keep working: run it as a user would.
func TestQuickstartPrintsTheAgentsReplyAndTheRun(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	s := quickstart(t, nil, "/sh echo quickstart-ok from uid $(id -u)")
	reply := s[strings.Index(s, "--- agent reply ---")+1:]
	if !ranAsAgentUID(reply, "quickstart-ok from uid ") || !strings.Contains(reply, "[exit code 0]") {
		t.Fatalf("quickstart did not print the confined agent's reply (as a uid of agent_uids):\n%s", s)
	}
	if !regexp.MustCompile(`(?m)^state:\s+succeeded$`).MatchString(s) {
		t.Fatalf("quickstart did not print the run as berthctl shows it:\n%s", s)
	}
	if !strings.Contains(s, "==> stopping the suite") {
		t.Fatalf("quickstart did not stop what it started:\n%s", s)
	}
}

// The README's demo, as is: the agent reads berth's own config and Landlock
// refuses it. A config the sandbox cannot even see (one under /tmp, which a
// host run has of its own) would show "No such file" and demonstrate
// nothing.
func TestTheQuickstartsDemoShowsLandlockRefusingBerthsConfig(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	s := quickstart(t, nil)
	if !regexp.MustCompile(`cat: \S+/etc/berth\.toml: Permission denied`).MatchString(s) {
		t.Fatalf("the demo did not show Landlock refusing berth's config:\n%s", s)
	}
}

func TestQuickstartWithContainerIsolationAnswersFromAContainer(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	testdocker.Engine(t)
	s := quickstart(t, nil, "--isolation", "container", "/sh echo boxed-quickstart-ok in $(pwd) as uid $(id -u); test -f /.dockerenv && echo made-by-docker")
	reply := s[strings.Index(s, "--- agent reply ---")+1:]
	if !ranAsAgentUID(reply, "boxed-quickstart-ok in /workspace as uid ") || !strings.Contains(reply, "made-by-docker") {
		t.Fatalf("quickstart did not print a reply from a container (as a uid of agent_uids):\n%s", s)
	}
	if !regexp.MustCompile(`(?m)^backend:\s+container$`).MatchString(s) || !regexp.MustCompile(`(?m)^state:\s+succeeded$`).MatchString(s) {
		t.Fatalf("quickstart did not print a succeeded container run:\n%s", s)
	}
	if !strings.Contains(s, "==> agent image berth-agent:") || !strings.Contains(s, "==> stopping the suite") {
		t.Fatalf("quickstart did not build the image or stop what it started:\n%s", s)
	}
}

// With a real provider's key the demo agent still has no network, on both
// backends: it reaches the model through its run's egress proxy, which
// adds the key, a host no rule allows is refused, and the run shows the
// proxy's decisions.
func TestQuickstartWithAProviderKeyReachesTheModelThroughTheEgressProxy(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	const key = "sk-quickstart-e2e-NOT-IN-THE-SANDBOX"
	tests := []struct {
		name    string
		args    []string
		refused string // what the tool printed for the refused host
	}{
		{"On_the_landlock_backend", []string{"run echo via-egress; env | grep -c _API_KEY; curl -s --max-time 5 http://files.example/"},
			"berth egress refused GET files.example:80"},
		{"On_the_container_backend", []string{"--isolation", "container", "run echo via-egress; env | grep -c _API_KEY; wget -q -O- http://files.example/ 2>&1"},
			"403 Forbidden"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.args[0] == "--isolation" {
				testdocker.Engine(t)
			}
			gpt := newFakeOpenAI(t)
			s := quickstart(t, []string{"OPENAI_API_KEY=" + key, "OPENAI_BASE_URL=" + gpt.srv.URL + "/v1", "OPENAI_MODEL=gpt-e2e"}, tt.args...)
			reply := s[strings.Index(s, "--- agent reply ---")+1:]
			// grep -c prints 0: no *_API_KEY in the tool's environment.
			if !strings.Contains(reply, "tool said: ") || !strings.Contains(reply, `via-egress\n0\n`) || !strings.Contains(reply, tt.refused) {
				t.Fatalf("quickstart did not print the model's reply after a tool run through the proxy:\n%s", s)
			}
			if !strings.Contains(s, "\negress:\n") || !strings.Contains(s, " POST 127.0.0.1:") || !strings.Contains(s, "GET files.example:80 / REFUSED") {
				t.Fatalf("the run lists no provider call and no refusal of the egress proxy:\n%s", s)
			}
			if strings.Contains(s, key) {
				t.Fatalf("the key is in the quickstart's output:\n%s", s)
			}
			gpt.mu.Lock()
			defer gpt.mu.Unlock()
			if len(gpt.auths) == 0 {
				t.Fatal("the model server got no call")
			}
			for _, auth := range gpt.auths {
				if auth != "Bearer "+key {
					t.Errorf("the model server got Authorization %q, want the key the proxy adds", auth)
				}
			}
		})
	}
}
