// Package confine restricts the berth-agent process with Landlock before it
// opens a file or starts a tool, and its tool processes further still: they
// start through a launcher into a nested Landlock domain that cannot reach
// the agent's /proc entry nor trace it (Launcher). After Landlock it loads a
// syscall filter that every tool inherits (InstallFilter, seccomp.go), and it
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
// sets no_new_privs. It refuses, without restricting anything, when abi is
// 0, or below MinNetworkABI while the policy forbids network access.
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
	cfg, rules, pathRules, err := ruleset(agentPolicy, abi, log)
	if err != nil {
		return nil, err
	}
	toolCfg, toolRules, toolPathRules, err := ruleset(ToolPolicy(policy, os.Getpid()), abi, log)
	if err != nil {
		return nil, fmt.Errorf("cannot plan the tools' confinement: %w", err)
	}
	toolFD, toolFlags, err := toolCfg.NewRulesetFD(toolRules...)
	if err == nil && toolFD < 0 {
		err = errors.New("the ruleset restricts nothing")
	}
	if err != nil {
		return nil, fmt.Errorf("cannot build the tools' Landlock ruleset: %w", err)
	}
	if err := cfg.Restrict(rules...); err != nil {
		unix.Close(toolFD)
		return nil, fmt.Errorf("cannot enforce Landlock ABI %d: %w", abi, err)
	}
	log.Info("confined with Landlock", "abi", abi, "path_rules", pathRules,
		"network", policy.Network, "connect_ports", policy.ConnectPorts, "tool_path_rules", toolPathRules)
	return newLauncher(os.NewFile(uintptr(toolFD), "tools-landlock-ruleset"), toolFlags), nil
}

// ruleset is the Landlock config and rules that enforce policy at abi.
func ruleset(policy agentproto.Policy, abi int, log *slog.Logger) (cfg landlock.Config, rules []landlock.Rule, pathRules int, err error) {
	if abi < 1 {
		return cfg, nil, 0, fmt.Errorf("cannot enforce file_access: kernel has no Landlock (ABI %d); refusing to run unconfined", abi)
	}
	if !policy.Network && abi < MinNetworkABI {
		return cfg, nil, 0, fmt.Errorf("cannot enforce network=false: kernel Landlock ABI %d cannot restrict TCP (needs ABI %d); refusing to run unconfined", abi, MinNetworkABI)
	}
	cfg = configs[min(abi, len(configs)-1)]
	if policy.Network {
		cfg.HandledAccessNet = 0
	}

	planned, err := Plan(policy.AllowRead, policy.AllowReadWrite, policy.Deny, log)
	if err != nil {
		return cfg, nil, 0, err
	}
	rules = make([]landlock.Rule, 0, len(planned)+len(policy.ConnectPorts))
	for _, r := range planned {
		rules = append(rules, landlock.PathAccess(rights(r, cfg.HandledAccessFS), r.Path))
	}
	if !policy.Network {
		for _, port := range policy.ConnectPorts {
			rules = append(rules, landlock.ConnectTCP(port))
		}
	}
	return cfg, rules, len(planned), nil
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
