// Package syscallfilter assembles berth-agent's syscall filter with
// github.com/elastic/go-seccomp-bpf: pure Go (berth-agent is a static binary
// that also runs in the scratch container image, so libseccomp and cgo are
// out), maintained (Beats load their own filter with it), with syscall
// tables generated from the kernel's and argument conditions (for clone and
// unshare). docs/adr/0012-host-run-namespaces-and-seccomp.md.
//
// berth-agent does not link this package: the program is the same for every
// run on an architecture, so it is assembled at build time
// (agent/confine/internal/genfilter writes agent/confine/zfilter_*.go, and
// the names alone to internal/hostsandbox/zrefused_*.go) and
// the agent only loads it; go-seccomp-bpf builds the syscall tables of every
// architecture when it is initialised, which cost each run more than the
// filter itself. A test in agent/confine fails when the generated program
// is not what Program assembles now.
package syscallfilter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"go/format"
	"reflect"
	"slices"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// NamespaceFlags are the clone/unshare flags that make a namespace (CLONE_NEWNS,
// NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: the mask Docker's
// profile uses); unshare also refuses CLONE_NEWTIME.
const NamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// actionENOSYS makes clone3 look absent: its flags sit in a struct the filter
// cannot read, and libc falls back to clone (whose flags it can) on ENOSYS.
const actionENOSYS = seccomp.Action(unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS))

// Policy is the syscall filter for the architecture goarch ("" for the
// running one, else a GOARCH name): everything is allowed but the names of
// refused that the architecture has and namespace-making clone/unshare
// (EPERM), and clone3 (ENOSYS).
func Policy(refused []string, goarch string) (seccomp.Policy, error) {
	info, err := arch.GetInfo(goarch)
	if err != nil {
		return seccomp.Policy{}, fmt.Errorf("cannot find the syscall table of this architecture: %w", err)
	}
	var names []string
	for _, n := range refused {
		if _, ok := info.SyscallNames[n]; ok && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	for _, must := range []string{"keyctl", "add_key", "request_key", "mount", "setns", "unshare", "clone"} {
		if _, ok := info.SyscallNames[must]; !ok {
			return seccomp.Policy{}, fmt.Errorf("cannot filter syscalls on %s: its table has no %s", info.Name, must)
		}
	}
	refuse := seccomp.SyscallGroup{Action: seccomp.ActionErrno, Names: names, NamesWithCondtions: []seccomp.NameWithConditions{
		{Name: "clone", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: NamespaceFlags}}},
		{Name: "unshare", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: NamespaceFlags | unix.CLONE_NEWTIME}}},
	}}
	p := seccomp.Policy{DefaultAction: seccomp.ActionAllow, Syscalls: []seccomp.SyscallGroup{refuse}}
	if _, ok := info.SyscallNames["clone3"]; ok {
		p.Syscalls = append(p.Syscalls, seccomp.SyscallGroup{Action: actionENOSYS, Names: []string{"clone3"}})
	}
	if goarch != "" {
		setArch(&p, info)
	}
	return p, nil
}

// setArch makes p assemble for info instead of the running architecture.
// go-seccomp-bpf only assembles for runtime.GOARCH (the field is
// unexported); the generator needs every architecture's program from one
// machine. The test in agent/confine checks, on the architecture it runs
// on, that this gives what the library assembles by itself.
func setArch(p *seccomp.Policy, info *arch.Info) {
	f := reflect.ValueOf(p).Elem().FieldByName("arch")
	reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Set(reflect.ValueOf(info))
}

// Filter is one architecture's assembled syscall filter.
type Filter struct {
	// AuditArch is the architecture's AUDIT_ARCH_* value, which
	// seccomp_data.arch holds for its native syscalls.
	AuditArch uint32
	// Refused are the names Program refuses with EPERM on this architecture.
	Refused []string
	// Library is the policy's program as go-seccomp-bpf's LoadFilter would
	// load it. It lets a syscall of another audit architecture through to
	// its default action (its table is the native one), so a 32-bit call
	// (int 0x80 on x86_64) would reach keyctl.
	Library []unix.SockFilter
	// Program is what berth-agent loads: ForeignArchGuard, refusing (EPERM)
	// every syscall of another audit architecture, then Library. One
	// program, so the kernel prepares and attaches one filter, not two.
	Program []unix.SockFilter
}

// ForeignArchGuard is how many instructions of Filter.Program precede
// Filter.Library.
const ForeignArchGuard = 3

// Assemble assembles the filter for goarch ("" for the running one).
func Assemble(refused []string, goarch string) (Filter, error) {
	p, err := Policy(refused, goarch)
	if err != nil {
		return Filter{}, err
	}
	info, err := arch.GetInfo(goarch)
	if err != nil {
		return Filter{}, fmt.Errorf("cannot find the syscall table of this architecture: %w", err)
	}
	insts, err := p.Assemble()
	if err != nil {
		return Filter{}, fmt.Errorf("cannot assemble the syscall filter: %w", err)
	}
	library, err := sockFilter(insts)
	if err != nil {
		return Filter{}, err
	}
	guard, err := sockFilter([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
	})
	if err != nil {
		return Filter{}, err
	}
	if len(guard) != ForeignArchGuard {
		return Filter{}, fmt.Errorf("cannot assemble the syscall filter: the foreign architecture guard has %d instructions, want %d", len(guard), ForeignArchGuard)
	}
	return Filter{AuditArch: uint32(info.ID), Refused: p.Syscalls[0].Names, Library: library, Program: append(guard, library...)}, nil
}

func sockFilter(insts []bpf.Instruction) ([]unix.SockFilter, error) {
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("cannot assemble the syscall filter's BPF: %w", err)
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out, nil
}

// GoFile is the Go source of package pkg that holds goarch's filter, for a
// file named zfilter_<goarch>.go: the constant generatedAuditArch and the
// variable generatedProgram (Filter's AuditArch and Program; the names it
// refuses are written once, by RefusedGoFile, for internal/hostsandbox).
// Plain types only, so that the package still
// compiles, and the generator still runs, whatever else changes in it.
func GoFile(pkg string, refused []string, goarch string) ([]byte, error) {
	// go-seccomp-bpf lays out 64-bit arguments in the assembling machine's
	// byte order; every architecture of GOARCHes is little-endian.
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		return nil, errors.New("cannot generate the syscall filters on a big-endian machine: the architectures they are for are little-endian")
	}
	f, err := Assemble(refused, goarch)
	if err != nil {
		return nil, err
	}
	var b []byte
	b = fmt.Appendf(b, "// Code generated by \"go run ./internal/genfilter\"; DO NOT EDIT.\n\n")
	b = fmt.Appendf(b, "package %s\n\nimport \"golang.org/x/sys/unix\"\n\n", pkg)
	b = fmt.Appendf(b, "// The syscall filter of %s, assembled from Refused by syscallfilter.Assemble.\n\n", goarch)
	b = fmt.Appendf(b, "const generatedAuditArch = %#x\n\n", f.AuditArch)
	b = fmt.Appendf(b, "var generatedProgram = []unix.SockFilter{\n")
	for _, in := range f.Program {
		b = fmt.Appendf(b, "\t{Code: %#04x, Jt: %d, Jf: %d, K: %#x},\n", in.Code, in.Jt, in.Jf, in.K)
	}
	b = fmt.Appendf(b, "}\n")
	return format.Source(b)
}

// RefusedGoFile is the Go source of package pkg that holds only the names
// goarch's filter refuses (the variable generatedRefused), for a file named
// zrefused_<goarch>.go in internal/hostsandbox: the host summarises the
// filter without linking its program.
func RefusedGoFile(pkg string, refused []string, goarch string) ([]byte, error) {
	f, err := Assemble(refused, goarch)
	if err != nil {
		return nil, err
	}
	var b []byte
	b = fmt.Appendf(b, "// Code generated by \"go run ./internal/genfilter\" in agent/confine; DO NOT EDIT.\n\n")
	b = fmt.Appendf(b, "package %s\n\n", pkg)
	b = fmt.Appendf(b, "// The syscalls the filter of %s refuses, assembled from Refused by syscallfilter.Assemble.\n\n", goarch)
	b = fmt.Appendf(b, "var generatedRefused = []string{\n")
	for _, n := range f.Refused {
		b = fmt.Appendf(b, "\t%q,\n", n)
	}
	b = fmt.Appendf(b, "}\n")
	return format.Source(b)
}

// GOARCHes are the architectures a filter is generated for: those
// go-seccomp-bpf has syscall tables of.
var GOARCHes = []string{"386", "amd64", "arm", "arm64"}
