package confine

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
)

// BenchmarkEnforcePlanning is the part of Enforce that can run in a test
// process without confining it: both plans (the agent's and the tools') and
// both Landlock rulesets, on isolation.HostPolicy's real policy for a
// workspace in a state dir with other agents and a config dir denied.
//
//	go test ./agent/confine -run '^$' -bench EnforcePlanning
func BenchmarkEnforcePlanning(b *testing.B) {
	abi := KernelABI()
	testenv.Need(b, abi >= MinNetworkABI, "kernel Landlock ABI is %d, the policy needs %d", abi, MinNetworkABI)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir, err := filepath.EvalSymlinks(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	workspace := filepath.Join(state, "agents", "alpha")
	for _, d := range []string{workspace, filepath.Join(state, "agents", "beta"), filepath.Join(state, "runs"), filepath.Join(dir, "etc-berth")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	policy := isolation.HostPolicy(isolation.FileAccess{}, workspace,
		[]string{state, filepath.Join(dir, "intake"), filepath.Join(dir, "etc-berth"), filepath.Join(state, "agents", "beta")})
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	policy.AllowRead = append(policy.AllowRead, self)

	for b.Loop() {
		fs, paths := newResolver(), openedPaths{}
		for _, pol := range []agentproto.Policy{policy, ToolPolicy(policy, os.Getpid())} {
			rs, err := ruleset(fs, pol, abi, quiet)
			if err != nil {
				b.Fatal(err)
			}
			fd, _, err := rs.build(paths)
			if err != nil {
				b.Fatal(err)
			}
			unix.Close(fd)
		}
		paths.close()
	}
}
