package main_test

import (
	"os/exec"
	"strings"
	"testing"
)

// berth-agent loads a syscall filter assembled at build time: the
// assembler (go-seccomp-bpf, whose package init builds the syscall tables
// of every architecture on every run) must not be linked into it.
func TestBerthAgentDoesNotLinkTheSyscallFilterAssembler(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/berth-dev/berth/cmd/berth-agent").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/elastic/go-seccomp-bpf") || pkg == "github.com/berth-dev/berth/agent/confine/syscallfilter" {
			t.Errorf("berth-agent links %s", pkg)
		}
	}
}
