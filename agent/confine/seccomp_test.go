package confine

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/agent/confine/syscallfilter"
	"github.com/berth-dev/berth/internal/hostsandbox"
)

// The filter assembles on this architecture and refuses what the issue
// names; loading it is tested from a real run (agent and isolation/landlock
// tests), since a filter cannot be removed from the test process.
func TestTheFilterAssemblesAndRefusesKeyringsAndNamespaces(t *testing.T) {
	t.Parallel()
	p, err := syscallfilter.Policy(hostsandbox.Refused, "")
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
		if !slices.Contains(hostsandbox.RefusedHere(), name) {
			t.Errorf("%s is not refused by the filter berth-agent loads", name)
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
		if slices.Contains(refused.Names, needed) || slices.Contains(hostsandbox.RefusedHere(), needed) {
			t.Errorf("%s, which berth-agent or its tools need, is refused", needed)
		}
	}
}

// berth-agent loads the program assembled at build time; it must be the
// one go-seccomp-bpf assembles from Refused today, on this architecture
// (the library by itself) and in every generated file (run `go generate
// ./agent/confine` after changing Refused or the policy).
func TestTheGeneratedFilterIsWhatThePolicyAssemblesNow(t *testing.T) {
	t.Parallel()
	native, err := syscallfilter.Assemble(hostsandbox.Refused, "")
	if err != nil {
		t.Fatal(err)
	}
	if generatedAuditArch != native.AuditArch || !slices.Equal(generatedProgram, native.Program) {
		t.Fatalf("zfilter_%s.go is not what go-seccomp-bpf assembles now; run go generate ./agent/confine", runtime.GOARCH)
	}
	// What the host says the filter refuses is what berth-agent loads.
	if !slices.Equal(hostsandbox.RefusedHere(), native.Refused) {
		t.Errorf("hostsandbox.RefusedHere() = %q, the loaded filter refuses %q", hostsandbox.RefusedHere(), native.Refused)
	}
	// What is loaded: the foreign architecture guard, then exactly the
	// program the library's own LoadFilter would load.
	p, err := syscallfilter.Policy(hostsandbox.Refused, "")
	if err != nil {
		t.Fatal(err)
	}
	insts, err := p.Assemble()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		t.Fatal(err)
	}
	library := generatedProgram[syscallfilter.ForeignArchGuard:]
	if len(library) != len(raw) {
		t.Fatalf("the loaded program has %d instructions after the guard, the library's %d", len(library), len(raw))
	}
	for i, r := range raw {
		if in := library[i]; in.Code != r.Op || in.Jt != r.Jt || in.Jf != r.Jf || in.K != r.K {
			t.Errorf("instruction %d after the guard is %+v, the library's is %+v", i, in, r)
		}
	}
	guard := generatedProgram[:syscallfilter.ForeignArchGuard]
	if guard[0] != (unix.SockFilter{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4}) ||
		guard[1] != (unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 1, K: generatedAuditArch}) ||
		guard[2] != (unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)}) {
		t.Errorf("the guard does not refuse other architectures with EPERM: %+v", guard)
	}
	// The generator assembles every architecture on one machine; here it
	// must agree with the library's own choice of architecture.
	named, err := syscallfilter.Assemble(hostsandbox.Refused, runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(named.Program, native.Program) || named.AuditArch != native.AuditArch {
		t.Errorf("assembling for %s by name differs from the library's native assembly", runtime.GOARCH)
	}
	for _, goarch := range syscallfilter.GOARCHes {
		want, err := syscallfilter.GoFile("confine", hostsandbox.Refused, goarch)
		if err != nil {
			t.Fatal(err)
		}
		have, err := os.ReadFile("zfilter_" + goarch + ".go")
		if err != nil {
			t.Fatal(err)
		}
		if string(have) != string(want) {
			t.Errorf("zfilter_%s.go is stale; run go generate ./agent/confine", goarch)
		}
		want, err = syscallfilter.RefusedGoFile("hostsandbox", hostsandbox.Refused, goarch)
		if err != nil {
			t.Fatal(err)
		}
		have, err = os.ReadFile(filepath.Join("..", "..", "internal", "hostsandbox", "zrefused_"+goarch+".go"))
		if err != nil {
			t.Fatal(err)
		}
		if string(have) != string(want) {
			t.Errorf("internal/hostsandbox/zrefused_%s.go is stale; run go generate ./agent/confine", goarch)
		}
	}
}
