package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation/container"
)

// memKey is this test's own provider key: other tests' runs with a direct
// network hold theirs in memory, by design.
const memKey = "sk-memscan-7f3c1e9a-NEVER-IN-A-SANDBOX"

// heldCall is a provider call the fake holds until the test releases it.
type heldCall struct {
	text    string // the last user message
	release chan struct{}
}

// holdingProvider is an OpenAI-compatible server that answers only with
// memKey and hands each call to the test before it answers, so the run is
// in flight, its agent waiting for the model, while the test looks at it.
func holdingProvider(t *testing.T) (*httptest.Server, <-chan heldCall) {
	calls := make(chan heldCall)
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+memKey {
			http.Error(w, `{"error":{"message":"missing or wrong key"}}`, http.StatusUnauthorized)
			return
		}
		var req struct {
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		c := heldCall{text: req.Messages[len(req.Messages)-1].Content, release: make(chan struct{})}
		select {
		case calls <- c:
		case <-done:
			return
		}
		select {
		case <-c.release:
		case <-done:
			return
		}
		reply, _ := json.Marshal("model saw: " + c.text)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","created":1,"model":"gpt-mem","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":`+string(reply)+`}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	t.Cleanup(func() { close(done); srv.Close() })
	return srv, calls
}

// procFinding is what a look at one process found.
type procFinding struct {
	pid      int
	exe      string
	where    []string // where the key was found: "memory", "environ", "cmdline"
	witness  bool     // the run's message text is in its memory
	regions  int
	scanned  int64
	scanErrs int
}

// inspectProcess reads pid's environ, cmdline and every readable mapping of
// its memory (/proc/<pid>/mem, which root may read although berth-agent is
// not dumpable) and says where key and witness are.
func inspectProcess(pid int, key, witness []byte) (procFinding, error) {
	f := procFinding{pid: pid}
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	f.exe, _ = os.Readlink(filepath.Join(dir, "exe"))
	for _, name := range []string{"environ", "cmdline"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return f, fmt.Errorf("cannot read %s of %d: %w", name, pid, err)
		}
		if bytes.Contains(b, key) {
			f.where = append(f.where, name)
		}
	}
	maps, err := os.ReadFile(filepath.Join(dir, "maps"))
	if err != nil {
		return f, fmt.Errorf("cannot read the maps of %d: %w", pid, err)
	}
	mem, err := os.Open(filepath.Join(dir, "mem"))
	if err != nil {
		return f, fmt.Errorf("cannot open the memory of %d: %w", pid, err)
	}
	defer mem.Close()
	inMemory := false
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[1][0] != 'r' {
			continue
		}
		if len(fields) >= 6 && (fields[5] == "[vvar]" || fields[5] == "[vsyscall]" || fields[5] == "[vvar_vclock]") {
			continue
		}
		var start, end uint64
		if _, err := fmt.Sscanf(fields[0], "%x-%x", &start, &end); err != nil {
			continue
		}
		f.regions++
		hasKey, hasWitness, n, err := scanRegion(mem, start, end, key, witness)
		f.scanned += n
		if err != nil {
			f.scanErrs++
		}
		inMemory = inMemory || hasKey
		f.witness = f.witness || hasWitness
	}
	if inMemory {
		f.where = append(f.where, "memory")
	}
	return f, nil
}

// scanRegion reads [start, end) of mem in chunks that overlap by the
// longest needle, so nothing is missed at a chunk boundary.
func scanRegion(mem *os.File, start, end uint64, key, witness []byte) (hasKey, hasWitness bool, n int64, err error) {
	const chunk = 1 << 20
	overlap := uint64(max(len(key), len(witness)))
	buf := make([]byte, chunk)
	for off := start; off < end; {
		size := min(uint64(chunk), end-off)
		got, rerr := mem.ReadAt(buf[:size], int64(off))
		n += int64(got)
		b := buf[:got]
		hasKey = hasKey || bytes.Contains(b, key)
		hasWitness = hasWitness || bytes.Contains(b, witness)
		if rerr != nil && got < int(size) {
			return hasKey, hasWitness, n, rerr
		}
		if off+size >= end {
			break
		}
		off += size - overlap
	}
	return hasKey, hasWitness, n, nil
}

// allPids are the host's processes.
func allPids(t *testing.T) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

func parentOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

// schedulerPid is the pid of this suite's berth-scheduler (the one whose
// environment names the suite's state dir).
func (s *suite) schedulerPid(t *testing.T) int {
	t.Helper()
	exe := filepath.Join(binDir, "berth-scheduler")
	for _, pid := range allPids(t) {
		if got, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); got != exe {
			continue
		}
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if bytes.Contains(env, []byte("BERTH_STATE_DIR="+s.StateDir+"\x00")) {
			return pid
		}
	}
	t.Fatal("cannot find this suite's berth-scheduler")
	return 0
}

// descendants are every process below root.
func descendants(t *testing.T, root int) []int {
	t.Helper()
	children := map[int][]int{}
	for _, pid := range allPids(t) {
		children[parentOf(pid)] = append(children[parentOf(pid)], pid)
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// samePidNamespace are the host's processes in pid's pid namespace: a
// container's processes as the host sees them.
func samePidNamespace(t *testing.T, pid int) []int {
	t.Helper()
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	if err != nil {
		t.Fatalf("cannot read the pid namespace of %d: %v", pid, err)
	}
	var out []int
	for _, p := range allPids(t) {
		if got, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", p)); got == ns {
			out = append(out, p)
		}
	}
	return out
}

// The attack, from the host side: while a run waits for its model,
// root reads the memory, environment and command line of every process of
// the sandbox and finds no provider key there, on both backends. The same
// scan finds the run's message in the agent's memory and the key in the
// egress proxy's memory, so it would find the key if the agent held it.
func TestRootFindsNoProviderKeyInTheMemoryOfAnInFlightSandbox(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t) // reading another user's /proc/<pid>/mem needs CAP_SYS_PTRACE
	_, err := os.Stat("/proc/self/mem")
	testenv.Need(t, err == nil, "/proc is not mounted")
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	model, calls := holdingProvider(t)
	sink := newReplySink(t)
	cfg := fmt.Sprintf(`[providers]
primary = "gpt"

[providers.gpt]
kind = "openai"
base_url = %q
api_key_env = "E2E_MEM_KEY"
model = "gpt-mem"

[[agents]]
id = "gpt"
max_iterations = 2

[[agents]]
id = "boxed"
max_iterations = 2
%s

# The control: an admin's direct-network opt-in, where the key travels into
# the sandbox on stdin, so the scan must find it there.
[[agents]]
id = "direct"
max_iterations = 2
[agents.file_access]
allow_network = true

[intake]
default_agent = "gpt"

[[connectors]]
id = "hooks"
type = "webhook"
secret = %q
reply_url = %q

[[bindings]]
connector = "hooks"
channel_id = "boxed"
agent = "boxed"

[[bindings]]
connector = "hooks"
channel_id = "direct"
agent = "direct"

[scheduler]
default_timeout_seconds = 120
run_as = "nobody"
egress_user = "daemon"
agent_binary = %q
`, model.URL+"/v1", containerAgent, secret, sink.srv.URL+"/replies", filepath.Join(binDir, "berth-agent"))
	s := launchShort(t, sink, cfg, []string{"E2E_MEM_KEY=" + memKey}, memKey)
	egressExe := filepath.Join(binDir, "berth-egress")

	landlockSandbox := func(t *testing.T, _ string) []int {
		var out []int
		for _, pid := range descendants(t, s.schedulerPid(t)) {
			if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); exe != egressExe {
				out = append(out, pid)
			}
		}
		return out
	}
	tests := []struct {
		name, channel string
		needDocker    bool
		// holdsKey: the key is on the sandbox's stdin (a direct network).
		holdsKey bool
		// sandbox are the processes of the run's sandbox, seen from the host.
		sandbox func(t *testing.T, runID string) []int
	}{
		{"A_landlock_run", "general", false, false, landlockSandbox},
		{"A_run_with_a_direct_network_holds_the_key_where_the_scan_finds_it", "direct", false, true, landlockSandbox},
		{"A_container_run", "boxed", true, false, func(t *testing.T, runID string) []int {
			cli := testdocker.Engine(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			list, err := cli.ContainerList(ctx, client.ContainerListOptions{Filters: make(client.Filters).Add("label", container.LabelRun+"="+runID)})
			if err != nil || len(list.Items) != 1 {
				t.Fatalf("the run's container: %v, %d found", err, len(list.Items))
			}
			info, err := cli.ContainerInspect(ctx, list.Items[0].ID, client.ContainerInspectOptions{})
			if err != nil {
				t.Fatalf("cannot inspect the run's container: %v", err)
			}
			if bytes.Contains(info.Raw, []byte(memKey)) {
				t.Error("docker inspect shows the provider key")
			}
			return samePidNamespace(t, info.Container.State.Pid)
		}},
	}
	for i, tt := range tests { // one at a time: the provider holds one call
		t.Run(tt.name, func(t *testing.T) {
			if tt.needDocker {
				testdocker.Engine(t)
			}
			message := fmt.Sprintf("memscan-witness-%d-%d", i, time.Now().UnixNano())
			id := s.mustPost(t, tt.channel, message)
			call := s.waitHeldCall(t, calls, id)
			released := false
			release := func() {
				if !released {
					released = true
					close(call.release)
				}
			}
			defer release()
			if call.text != message {
				t.Fatalf("the provider got %q, want this run's message %q", call.text, message)
			}
			runID := s.runIDOf(t, id)

			pids := tt.sandbox(t, runID)
			if len(pids) == 0 {
				t.Fatal("found no process of the run's sandbox")
			}
			witnessed, keyFound := false, false
			for _, pid := range pids {
				f, err := inspectProcess(pid, []byte(memKey), []byte(message))
				if err != nil {
					t.Fatalf("cannot inspect sandbox process %d: %v", pid, err)
				}
				t.Logf("sandbox process %d %s: %d regions, %d bytes read, %d unreadable regions, message found %v", pid, f.exe, f.regions, f.scanned, f.scanErrs, f.witness)
				keyFound = keyFound || len(f.where) > 0
				if len(f.where) > 0 && !tt.holdsKey {
					t.Errorf("the provider key is in the %s of sandbox process %d (%s)", strings.Join(f.where, ", "), pid, f.exe)
				}
				witnessed = witnessed || f.witness
			}
			if !witnessed {
				t.Error("the run's message is in no sandbox process's memory: the scan does not see the agent's memory")
			}
			if tt.holdsKey {
				if !keyFound {
					t.Error("the scan missed the key of a direct-network run, which the agent holds: it would miss a leak too")
				}
				release()
				s.sink.wait(t, 2*time.Minute, id)
				return
			}
			// The control: the proxy, outside the sandbox, holds the key, and
			// the same scan finds it.
			proxyHasKey := false
			for _, pid := range descendants(t, s.schedulerPid(t)) {
				if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); exe != egressExe {
					continue
				}
				if f, err := inspectProcess(pid, []byte(memKey), []byte(message)); err == nil && strings.Contains(strings.Join(f.where, " "), "memory") {
					proxyHasKey = true
				}
			}
			if !proxyHasKey {
				t.Error("the scan did not find the key in the egress proxy's memory, where it must be")
			}

			release()
			reply := s.sink.wait(t, 2*time.Minute, id)[id]
			if reply["state"] != "succeeded" || text(reply) != "model saw: "+message {
				t.Errorf("state %v, error %v, reply %q; want the model's reply", reply["state"], reply["error"], text(reply))
			}
		})
	}
	s.noKeyInRuns(t, memKey)
}

// waitHeldCall waits until the provider holds a call, failing with the
// run's outcome when the run ends without one.
func (s *suite) waitHeldCall(t *testing.T, calls <-chan heldCall, id string) heldCall {
	t.Helper()
	deadline := time.After(3 * time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case c := <-calls:
			return c
		case <-deadline:
			t.Fatal("the run never called its provider")
		case <-tick.C:
			s.sink.mu.Lock()
			rs := s.sink.byID[id]
			s.sink.mu.Unlock()
			if len(rs) > 0 {
				t.Fatalf("the run ended without calling its provider: state %v, error %v, reply %q", rs[0]["state"], rs[0]["error"], text(rs[0]))
			}
		}
	}
}
