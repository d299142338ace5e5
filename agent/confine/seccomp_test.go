package confine

import (
	"slices"
	"testing"
)

// The filter assembles on this architecture and refuses what the issue
// names; loading it is tested from a real run (agent and isolation/landlock
// tests), since a filter cannot be removed from the test process.
func TestTheFilterAssemblesAndRefusesKeyringsAndNamespaces(t *testing.T) {
	t.Parallel()
	p, err := FilterPolicy()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Assemble(); err != nil {
		t.Fatalf("the filter does not assemble: %v", err)
	}
	refused := p.Syscalls[0]
	for _, name := range []string{"keyctl", "add_key", "request_key", "mount", "umount2", "pivot_root", "setns", "bpf", "perf_event_open", "userfaultfd", "kexec_load", "init_module", "open_by_handle_at"} {
		if !slices.Contains(refused.Names, name) {
			t.Errorf("%s is not refused", name)
		}
	}
	var conditional []string
	for _, c := range refused.NamesWithCondtions {
		conditional = append(conditional, c.Name)
	}
	if !slices.Equal(conditional, []string{"clone", "unshare"}) {
		t.Errorf("conditionally refused: %q, want clone and unshare", conditional)
	}
	for _, needed := range []string{"landlock_restrict_self", "landlock_create_ruleset", "execve", "clone", "setpgid", "kill", "bind", "listen", "connect", "ptrace"} {
		if slices.Contains(refused.Names, needed) {
			t.Errorf("%s, which berth-agent or its tools need, is refused", needed)
		}
	}
}
