// Package confine restricts the berth-agent process with Landlock before it
// opens a file or starts a tool, and its tool processes further still: they
// start through a launcher into a nested Landlock domain that cannot reach
// the agent's /proc entry nor trace it (Launcher). With Landlock it loads a
// syscall filter that every tool inherits (InstallFilter, seccomp.go; the
// program is assembled at build time by package syscallfilter), and it
// hides the host's socket directories in a host run's mount namespace
// (MaskSocketDirs, masks.go; MaskSelf when berth-agent must do it itself).
// It fails closed: when the kernel cannot enforce what
// the policy asks, Enforce returns an error and the caller must not run
// anything.
package confine

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentproto"
)

// TestABIEnv names the environment variable that caps the Landlock ABI the
// agent believes the kernel has. It is for tests only: it can only lower the
// ABI, so it can only make a run fail closed, never weaken confinement.
const TestABIEnv = "BERTH_TEST_LANDLOCK_ABI"

// MinNetworkABI is the first Landlock ABI that restricts TCP bind and connect.
const MinNetworkABI = 4

// configs holds go-landlock's preset for each ABI; index 0 means no Landlock.
var configs = []landlock.Config{{}, landlock.V1, landlock.V2, landlock.V3, landlock.V4,
	landlock.V5, landlock.V6, landlock.V7, landlock.V8, landlock.V9, landlock.V10, landlock.V11}

// KernelABI returns the Landlock ABI the running kernel supports, the way
// go-landlock judges it (ABI 6+ without the signal scoping fix counts as 5),
// capped at the newest ABI go-landlock knows.
func KernelABI() int {
	v, err := ll.LandlockGetABIVersion()
	if err != nil || v < 0 {
		return 0
	}
	if v >= 6 {
		errata, err := ll.LandlockGetErrata()
		if err != nil || errata&0x2 == 0 {
			v = 5
		}
	}
	return min(v, len(configs)-1)
}

// EffectiveABI is KernelABI, lowered by TestABIEnv when that is set.
func EffectiveABI() (int, error) {
	abi := KernelABI()
	if s, ok := os.LookupEnv(TestABIEnv); ok {
		capped, err := strconv.Atoi(s)
		if err != nil || capped < 0 {
			return 0, fmt.Errorf("cannot read %s=%q: want a non-negative integer", TestABIEnv, s)
		}
		abi = min(abi, capped)
	}
	return abi, nil
}

// Enforce confines the calling process (all its threads, and every process it
// starts) to policy, using the full rights of the given Landlock ABI, and
// loads the syscall filter (InstallFilter), which sets no_new_privs on every
// thread. It refuses, without restricting anything, when abi is 0, or below
// MinNetworkABI while the policy forbids network access.
//
// The agent also gets read and execute on its own executable, wherever it
// is installed: tool processes start by re-executing it (see Launcher).
//
// It returns the Launcher that starts tool processes in their own, stricter
// domain (ToolPolicy): nothing a tool runs can read or trace the agent.
func Enforce(policy agentproto.Policy, abi int, log *slog.Logger) (*Launcher, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("cannot find berth-agent's executable: %w", err)
	}
	agentPolicy := policy
	agentPolicy.AllowRead = append(append([]string(nil), policy.AllowRead...), self)
	fs := newResolver()
	agentSet, err := ruleset(fs, agentPolicy, abi, log)
	if err != nil {
		return nil, err
	}
	toolSet, err := ruleset(fs, ToolPolicy(policy, os.Getpid()), abi, log)
	if err != nil {
		return nil, fmt.Errorf("cannot plan the tools' confinement: %w", err)
	}
	// Both rulesets name nearly the same paths: each is opened once.
	paths := openedPaths{}
	defer paths.close()
	toolFD, toolFlags, err := toolSet.build(paths)
	if err != nil {
		return nil, fmt.Errorf("cannot build the tools' Landlock ruleset: %w", err)
	}
	agentFD, agentFlags, err := agentSet.build(paths)
	if err != nil {
		unix.Close(toolFD)
		return nil, fmt.Errorf("cannot build berth-agent's Landlock ruleset: %w", err)
	}
	paths.close()
	defer unix.Close(agentFD)
	// The filter first: loaded with TSYNC, it also sets no_new_privs on
	// every thread, which Landlock needs on each thread it restricts (so
	// no second pass over all threads just for that).
	if err := InstallFilter(); err != nil {
		unix.Close(toolFD)
		return nil, err
	}
	if err := restrictAllThreads(agentFD, agentFlags, abi); err != nil {
		unix.Close(toolFD)
		return nil, fmt.Errorf("cannot enforce Landlock ABI %d: %w", abi, err)
	}
	log.Info("confined with Landlock", "abi", abi, "path_rules", len(agentSet.paths),
		"network", policy.Network, "connect_ports", policy.ConnectPorts, "tool_path_rules", len(toolSet.paths))
	return newLauncher(os.NewFile(uintptr(toolFD), "tools-landlock-ruleset"), toolFlags), nil
}

// restrictAllThreads enforces the ruleset on every thread of the process,
// as go-landlock's Config.Restrict does: with TSYNC from ABI 8 on, else on
// each thread in turn (abi is Enforce's, never above the kernel's). Every
// thread must have no_new_privs already (the syscall filter's TSYNC gave it
// to them).
func restrictAllThreads(fd int, flags uint32, abi int) error {
	var err error
	if abi >= 8 {
		// From ABI 11 the kernel sets no_new_privs itself, on every thread,
		// once the enforcement succeeds; they have it already.
		err = ll.LandlockRestrictSelf(fd, flags|ll.FlagRestrictSelfTSync)
	} else {
		err = ll.AllThreadsLandlockRestrictSelf(fd, flags)
	}
	if errors.Is(err, unix.E2BIG) {
		return fmt.Errorf("the maximum number of stacked rulesets is reached: %w", err)
	}
	if err != nil {
		return fmt.Errorf("landlock_restrict_self: %w", err)
	}
	return nil
}

// plannedRuleset is a Landlock ruleset to build: its config, the planned
// path rules and the TCP ports it may connect to.
type plannedRuleset struct {
	cfg   landlock.Config
	paths []Rule
	ports []uint16
}

// ruleset plans the Landlock ruleset that enforces policy at abi, with what
// fs has already resolved.
func ruleset(fs *resolver, policy agentproto.Policy, abi int, log *slog.Logger) (plannedRuleset, error) {
	var rs plannedRuleset
	if abi < 1 {
		return rs, fmt.Errorf("cannot enforce file_access: kernel has no Landlock (ABI %d); refusing to run unconfined", abi)
	}
	if !policy.Network && abi < MinNetworkABI {
		return rs, fmt.Errorf("cannot enforce network=false: kernel Landlock ABI %d cannot restrict TCP (needs ABI %d); refusing to run unconfined", abi, MinNetworkABI)
	}
	rs.cfg = configs[min(abi, len(configs)-1)]
	if policy.Network {
		rs.cfg.HandledAccessNet = 0
	} else {
		rs.ports = policy.ConnectPorts
	}
	planned, err := fs.plan(policy.AllowRead, policy.AllowReadWrite, policy.Deny, log)
	if err != nil {
		return rs, err
	}
	rs.paths = planned
	return rs, nil
}

// build creates the ruleset and returns its descriptor and the flags to
// enforce it with. go-landlock makes the (empty) ruleset, checking its
// config against the kernel; the rules are added here, from descriptors
// opened once for all the rulesets of one Enforce (paths).
func (rs plannedRuleset) build(paths openedPaths) (int, uint32, error) {
	fd, flags, err := rs.cfg.NewRulesetFD()
	if err == nil && fd < 0 {
		err = errors.New("the ruleset restricts nothing")
	}
	if err != nil {
		return -1, 0, err
	}
	if err := rs.addRules(fd, paths); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, flags, nil
}

func (rs plannedRuleset) addRules(fd int, paths openedPaths) error {
	for _, r := range rs.paths {
		access := rights(r, rs.cfg.HandledAccessFS)
		if access == 0 {
			continue // nothing to grant; the kernel refuses an empty rule
		}
		pathFD, err := paths.open(r.Path)
		if err != nil {
			return fmt.Errorf("populating ruleset for %q with access %v: open: %w", r.Path, access, err)
		}
		attr := ll.PathBeneathAttr{ParentFd: pathFD, AllowedAccess: uint64(access)}
		if err := ll.LandlockAddPathBeneathRule(fd, &attr, 0); err != nil {
			return fmt.Errorf("populating ruleset for %q with access %v: landlock_add_rule: %w", r.Path, access, err)
		}
	}
	if rs.cfg.HandledAccessNet&ll.AccessNetConnectTCP != 0 {
		for _, port := range rs.ports {
			attr := ll.NetPortAttr{AllowedAccess: ll.AccessNetConnectTCP, Port: uint64(port)}
			if err := ll.LandlockAddNetPortRule(fd, &attr, 0); err != nil {
				return fmt.Errorf("populating ruleset for TCP port %d: landlock_add_rule: %w", port, err)
			}
		}
	}
	return nil
}

// openedPaths are O_PATH descriptors of rule paths, opened once each.
type openedPaths map[string]int

func (o openedPaths) open(path string) (int, error) {
	if fd, ok := o[path]; ok {
		return fd, nil
	}
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	o[path] = fd
	return fd, nil
}

func (o openedPaths) close() {
	for path, fd := range o {
		unix.Close(fd)
		delete(o, path)
	}
}

const (
	readRights      = ll.AccessFSExecute | ll.AccessFSReadFile | ll.AccessFSReadDir
	fileOnlyRights  = ll.AccessFSExecute | ll.AccessFSReadFile | ll.AccessFSWriteFile | ll.AccessFSTruncate | ll.AccessFSIoctlDev
	readWriteRights = 1<<64 - 1 // everything the ABI handles
)

// rights maps a planned rule to the Landlock access rights it grants, limited
// to what the config handles; files never get directory-only rights.
func rights(r Rule, handled landlock.AccessFSSet) landlock.AccessFSSet {
	var a landlock.AccessFSSet = readRights
	if r.Access == ReadWrite {
		a = readWriteRights
	}
	if !r.Dir {
		a &= fileOnlyRights
	}
	return a & handled
}
