package main_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
)

// BenchmarkConfinedRun execs the static berth-agent as nobody, the way a
// root scheduler's host run does (HostPolicy's policy for a workspace in a
// state dir with other agents and a config dir denied, the offline local
// provider, a message that needs no tool; with-egress adds the run's egress
// proxy, as a run without a network of its own has), and reports per run
// the CPU the agent used (user + system, from the child's rusage), the wall
// time and its page faults. BENCH_AGENT_BINARY names other builds to
// measure instead, separated by colons (a build of the tree before a change
// beside one after it): each iteration runs each of them once, in turn, so
// a machine's changing load falls on all of them alike, and each gets its
// own metrics (…/run-1, -2…). BENCH_AGENT_PAGECACHE: see settlePageCache.
//
//	go test ./cmd/berth-agent -run '^$' -bench ConfinedRun -benchtime 200x
func BenchmarkConfinedRun(b *testing.B) {
	testenv.NeedRoot(b)
	if abi := confine.KernelABI(); abi < confine.MinNetworkABI {
		testenv.Need(b, false, "kernel Landlock ABI is %d, the run needs %d", abi, confine.MinNetworkABI)
	}
	dir, err := testenv.OpenDir("berth-agent-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	var bins []string
	if list := os.Getenv("BENCH_AGENT_BINARY"); list != "" {
		bins = strings.Split(list, ":")
	} else {
		bin, err := testenv.BuildStatic(dir, "berth-agent", "github.com/berth-dev/berth/cmd/berth-agent")
		if err != nil {
			b.Fatal(err)
		}
		bins = []string{bin}
	}

	for _, bin := range bins {
		if err := settlePageCache(bin, os.Getenv("BENCH_AGENT_PAGECACHE")); err != nil {
			b.Fatal(err)
		}
	}

	state := filepath.Join(dir, "state")
	workspace := filepath.Join(state, "agents", "alpha")
	configDir := filepath.Join(dir, "etc-berth")
	for _, d := range []string{workspace, filepath.Join(state, "agents", "beta"), filepath.Join(state, "agents", "gamma"),
		filepath.Join(state, "runs"), filepath.Join(dir, "intake"), configDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.Chown(workspace, 65534, 65534); err != nil {
		b.Fatal(err)
	}
	protect := []string{state, filepath.Join(dir, "intake"), configDir,
		filepath.Join(state, "agents", "beta"), filepath.Join(state, "agents", "gamma")}
	policy := isolation.HostPolicy(isolation.FileAccess{}, workspace, protect)

	for _, variant := range []struct {
		name   string
		egress *agentproto.Egress
	}{
		{"landlock", nil},
		// The proxy binds an ephemeral port of the host's loopback here
		// (a run's own namespace in production); nothing dials its socket.
		{"with-egress", &agentproto.Egress{ProxyAddr: "127.0.0.1:0", Socket: filepath.Join(dir, "egress.sock"), Token: "bench-token"}},
	} {
		b.Run(variant.name, func(b *testing.B) {
			cpu, wall := make([]time.Duration, len(bins)), make([]time.Duration, len(bins))
			faults := make([]int64, len(bins))
			for i := 0; b.Loop(); i++ {
				for j, bin := range bins {
					c, w, f := confinedRun(b, bin, fmt.Sprintf("%d-%d", i, j), workspace, policy, variant.egress)
					cpu[j] += c
					wall[j] += w
					faults[j] += f
				}
			}
			for j := range bins {
				suffix := ""
				if len(bins) > 1 {
					suffix = fmt.Sprintf("-%d", j+1)
				}
				b.ReportMetric(float64(cpu[j].Microseconds())/1000/float64(b.N), "cpu-ms/run"+suffix)
				b.ReportMetric(float64(wall[j].Microseconds())/1000/float64(b.N), "wall-ms/run"+suffix)
				b.ReportMetric(float64(faults[j])/float64(b.N), "faults/run"+suffix)
			}
		})
	}
}

// confinedRun runs bin once as nobody and returns the CPU it used (user +
// system), the wall time until it exited and its page faults; it fails b
// unless the run answered.
func confinedRun(b *testing.B, bin, id, workspace string, policy agentproto.Policy, egress *agentproto.Egress) (cpu, wall time.Duration, faults int64) {
	req := agentproto.Request{
		Version:   agentproto.Version,
		RunID:     "run-" + id,
		Agent:     agentproto.Agent{ID: "alpha", Name: "Alpha", MaxIterations: 5},
		Message:   agentproto.Message{ID: "m-" + id, Connector: "bench", Channel: "alpha", Author: "bench", Text: "ping " + id},
		Provider:  agentproto.Provider{Name: "offline", Kind: "local"},
		Policy:    policy,
		Workspace: workspace,
		Egress:    egress,
	}
	stdin, err := json.Marshal(req)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Dir = "/"
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	start := time.Now()
	if err := cmd.Run(); err != nil {
		b.Fatalf("run %s of %s: %v\nstdout: %s\nstderr: %s", id, bin, err, stdout.String(), stderr.String())
	}
	wall = time.Since(start)
	var resp agentproto.Response
	if err := json.Unmarshal(stdout.Bytes(), &resp); err != nil || resp.Reply == "" || resp.Error != "" {
		b.Fatalf("run %s of %s: no reply (%v): %s\nstderr: %s", id, bin, err, stdout.String(), stderr.String())
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), wall, ru.Minflt + ru.Majflt
}

// settlePageCache puts each build's pages in the page cache the same way,
// since how they got there moves a run's CPU by more than a millisecond
// (the page faults of an exec map them): mode "" (the default) drops them
// and reads the file through once, as a binary read(2) from disk is held;
// "fault" only drops them, so the first run's page faults bring them back
// (a binary first executed after boot); "keep" leaves them as they are
// (`go build` writes through a mapping, which left them the slowest here).
func settlePageCache(bin, mode string) error {
	if mode == "keep" {
		return nil
	}
	f, err := os.Open(bin)
	if err != nil {
		return fmt.Errorf("cannot open %s: %w", bin, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("cannot write %s back: %w", bin, err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("cannot drop %s from the page cache: %w", bin, err)
	}
	switch mode {
	case "fault":
		return nil
	case "":
		if _, err := io.Copy(io.Discard, f); err != nil {
			return fmt.Errorf("cannot read %s: %w", bin, err)
		}
		return nil
	}
	return fmt.Errorf("BENCH_AGENT_PAGECACHE=%q: want empty, fault or keep", mode)
}
