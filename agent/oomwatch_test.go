package agent_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/mountinfo"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// A tool the kernel OOM-kills is counted in the agent's response, read
// from the agent's own cgroup after Landlock was enforced: the supervisor
// then knows the run hit its memory limit without the engine's word. A
// run whose tools stay under the limit counts none.
func TestTheAgentCountsItsToolsOOMKills(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	requireLandlock(t, 1)
	for _, tc := range []struct {
		name, command string
		want          bool
	}{
		{"A_tool_over_the_limit_is_counted", "/sh head -c 400000000 /dev/zero | tail | wc -c; echo status=$?", true},
		{"A_tool_under_the_limit_is_not", "/sh head -c 1000000 /dev/zero | tail | wc -c", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := memoryCgroup(t, 64<<20)
			f := newFixture(t)
			req := f.request(tc.command)
			req.Policy.AllowRead = append(req.Policy.AllowRead, "/dev/zero")
			stdin, err := json.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			// The agent joins the limited cgroup before it starts, as a
			// run's agent is started in its sandbox's.
			cmd := exec.Command("/bin/sh", "-c", `echo $$ > "$1/cgroup.procs" && exec "$2"`, "sh", dir, agentBinary)
			cmd.Env = []string{"PATH=/usr/bin:/bin"}
			cmd.Stdin = bytes.NewReader(stdin)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("berth-agent: %v\nstderr: %s", err, stderr.String())
			}
			var resp agentproto.Response
			if err := json.Unmarshal(stdout.Bytes(), &resp); err != nil {
				t.Fatalf("stdout is not a response: %v\n%s", err, stdout.String())
			}
			if got := resp.OOMKills > 0; got != tc.want {
				t.Fatalf("oom_kills = %d, want counted %v\ntool calls: %+v\nstderr: %s", resp.OOMKills, tc.want, resp.ToolCalls, stderr.String())
			}
		})
	}
}

// memoryCgroup makes a memory cgroup limited to limit bytes (no swap) at
// the top of this host's memory hierarchy, removed after the test.
func memoryCgroup(t *testing.T, limit int64) string {
	t.Helper()
	mounts, err := mountinfo.Read(mountinfo.Self)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("berth-oomtest-%d-%d", os.Getpid(), time.Now().UnixNano())
	var dir string
	var limits [][2]string
	for _, m := range mounts {
		if m.FSType == "cgroup" && strings.Contains(","+strings.Join(m.Super, ",")+",", ",memory,") {
			dir = filepath.Join(m.Point, name)
			limits = [][2]string{{"memory.limit_in_bytes", fmt.Sprint(limit)}}
			break
		}
	}
	if dir == "" {
		for _, m := range mounts {
			if m.FSType == "cgroup2" {
				dir = filepath.Join(m.Point, name)
				limits = [][2]string{{"memory.max", fmt.Sprint(limit)}, {"memory.swap.max", "0"}}
				break
			}
		}
	}
	testenv.Need(t, dir != "", "no cgroup filesystem with a memory controller is mounted")
	if err := os.Mkdir(dir, 0o755); err != nil {
		testenv.Need(t, false, "cannot make a memory cgroup: %v", err)
	}
	t.Cleanup(func() {
		// A killed process leaves its cgroup a moment after its end.
		deadline := time.Now().Add(10 * time.Second)
		for err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist); err = os.Remove(dir) {
			if time.Now().After(deadline) {
				t.Errorf("cannot remove cgroup %s: %v", dir, err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	for _, l := range limits {
		if err := os.WriteFile(filepath.Join(dir, l[0]), []byte(l[1]), 0o644); err != nil && !(l[0] == "memory.swap.max" && errors.Is(err, os.ErrNotExist)) {
			t.Fatalf("cannot limit cgroup %s: %v", dir, err)
		}
	}
	return dir
}
