package e2e

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testdocker"
	"github.com/berth-dev/berth/internal/testenv"
)

// The README's first command must keep working: run it as a user would.
func TestQuickstartPrintsTheAgentsReplyAndTheRun(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Join(filepath.Dir(file), "..")
	cmd := exec.Command(filepath.Join(repo, "scripts", "quickstart.sh"), "/sh echo quickstart-ok from $(id -un)")
	cmd.Dir = repo
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("quickstart failed: %v\n%s", err, out)
	}
	s := string(out)
	reply := s[strings.Index(s, "--- agent reply ---")+1:]
	if !strings.Contains(reply, "quickstart-ok from nobody") || !strings.Contains(reply, "[exit code 0]") {
		t.Fatalf("quickstart did not print the confined agent's reply:\n%s", s)
	}
	if !regexp.MustCompile(`(?m)^state:\s+succeeded$`).MatchString(s) {
		t.Fatalf("quickstart did not print the run as berthctl shows it:\n%s", s)
	}
	if !strings.Contains(s, "==> stopping the suite") {
		t.Fatalf("quickstart did not stop what it started:\n%s", s)
	}
}

func TestQuickstartWithContainerIsolationAnswersFromAContainer(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	testdocker.Engine(t)
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Join(filepath.Dir(file), "..")
	cmd := exec.Command(filepath.Join(repo, "scripts", "quickstart.sh"), "--isolation", "container", "/sh echo boxed-quickstart-ok as $(id -un) in $(pwd); test -f /.dockerenv && echo made-by-docker")
	cmd.Dir = repo
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("quickstart --isolation container failed: %v\n%s", err, out)
	}
	s := string(out)
	reply := s[strings.Index(s, "--- agent reply ---")+1:]
	if !strings.Contains(reply, "boxed-quickstart-ok as nobody in /workspace") || !strings.Contains(reply, "made-by-docker") {
		t.Fatalf("quickstart did not print a reply from a container:\n%s", s)
	}
	if !regexp.MustCompile(`(?m)^backend:\s+container$`).MatchString(s) || !regexp.MustCompile(`(?m)^state:\s+succeeded$`).MatchString(s) {
		t.Fatalf("quickstart did not print a succeeded container run:\n%s", s)
	}
	if !strings.Contains(s, "==> agent image berth-agent:") || !strings.Contains(s, "==> stopping the suite") {
		t.Fatalf("quickstart did not build the image or stop what it started:\n%s", s)
	}
}
