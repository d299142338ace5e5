package berth_test

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/berth-dev/berth"

// goList runs `go list` with args in the repository and returns its lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list %v: %v\n%s", args, err, stderr)
	}
	return strings.Fields(string(out))
}

var packageRow = regexp.MustCompile("(?m)^\\| `([a-z0-9./_-]+)` \\|")

// TestEveryPackageIsOnTheMap holds docs/architecture.md's package table and
// `go list ./...` together: a package nobody wrote down, or a row for one
// that is gone, fails here.
func TestEveryPackageIsOnTheMap(t *testing.T) {
	doc, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	var mapped []string
	for _, m := range packageRow.FindAllStringSubmatch(string(doc), -1) {
		mapped = append(mapped, m[1])
	}
	if len(mapped) < 10 {
		t.Fatalf("docs/architecture.md lists %d packages; its table rows must read | `path` | … |", len(mapped))
	}
	var listed []string
	for _, p := range goList(t, "./...") {
		rel := strings.TrimPrefix(strings.TrimPrefix(p, module), "/")
		if rel == "" {
			continue // this test's own package
		}
		listed = append(listed, rel)
	}
	for _, p := range listed {
		if !slices.Contains(mapped, p) {
			t.Errorf("package %s is not in docs/architecture.md's package table", p)
		}
	}
	for _, p := range mapped {
		if !slices.Contains(listed, p) {
			t.Errorf("docs/architecture.md lists %s, which `go list ./...` does not have", p)
		}
	}
}

// TestTheSchedulerOnlySchedules holds the run preparation in internal/runprep:
// the scheduler itself reaches no backend package and no egress proxy.
func TestTheSchedulerOnlySchedules(t *testing.T) {
	for _, imp := range goList(t, "-f", `{{join .Imports " "}}`, "./services/scheduler") {
		if strings.HasPrefix(imp, module+"/isolation/") || imp == module+"/services/egress" {
			t.Errorf("services/scheduler imports %s: a run's preparation (users, workspaces, images, egress proxies) belongs to internal/runprep", imp)
		}
	}
}

// TestImportRulesHold checks the import rules docs/architecture.md states as
// held today.
func TestImportRulesHold(t *testing.T) {
	rules := []struct {
		pkg     string
		refuse  []string
		because string
	}{
		{pkg: "./internal/config", refuse: []string{module + "/isolation"}, because: "config is read by every process; the egress rules live in internal/egresspolicy"},
		{pkg: "./internal/egresspolicy", refuse: []string{module + "/isolation", module + "/services", module + "/internal/config"}, because: "it is the leaf both config and the proxy import"},
		{pkg: "./agent/...", refuse: []string{module + "/services", module + "/isolation"}, because: "the sandbox's side never links the host's"},
		{pkg: "./cmd/berth-agent", refuse: []string{"go.etcd.io/bbolt", "github.com/moby/moby"}, because: "berth-agent goes into every image: no store, no engine client"},
		{pkg: "./isolation/...", refuse: []string{module + "/agent"}, because: "the host's side shares only the leaf internal/hostsandbox with the sandbox's"},
		{pkg: "./internal/agentproto", refuse: []string{"golang.org/x/sys/unix"}, because: "the protocol is a contract, not a place for syscalls (rlimits live in internal/hostsandbox)"},
		{pkg: "./internal/hostsandbox", refuse: []string{module + "/agent", module + "/isolation", module + "/services", "github.com/landlock-lsm/go-landlock", "github.com/elastic/go-seccomp-bpf"}, because: "it is the leaf the host and the sandbox share"},
		{pkg: "./cmd/berthctl", refuse: []string{module + "/isolation", module + "/internal/runplan", module + "/services"}, because: "berthctl decodes what the bus carries with internal/busapi's types; it links no backend, plan compiler or service"},
		{pkg: "./cmd/berth-scheduler", refuse: []string{"github.com/openai/openai-go", "github.com/anthropics/anthropic-sdk-go", "github.com/landlock-lsm/go-landlock"}, because: "provider checks are berth-agent probe runs and masks come from internal/hostsandbox: the scheduler links no model SDK and no Landlock"},
	}
	for _, r := range rules {
		deps := goList(t, "-deps", r.pkg)
		for _, d := range deps {
			for _, bad := range r.refuse {
				if d == bad || strings.HasPrefix(d, bad+"/") {
					t.Errorf("%s depends on %s: %s", r.pkg, d, r.because)
				}
			}
		}
	}
}
