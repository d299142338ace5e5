// Command bench-container measures how long a message waits for its
// container and its reply: from Submit to berth-agent having read its
// request (the time of its "confined with Landlock" log line, written right
// after the read) and to the run's end (its reply committed to
// scheduler.db: what intake is handed next), for a cold container agent and
// a warm one (container_mode.warm = 1), each with the container's end in
// the run's path (killed, waited for and removed before the run ends) and
// after the reply (container.Options.RemoveInBackground, as berth-scheduler
// runs: answered once the agent's response and log are complete), and, in
// the same run, `docker run --rm -i` of the same image with the same flags
// (to its log line, and to its exit). It prints median and p95 of each, and
// the backend's engine calls of the cold path. Run it through
// scripts/bench-container.sh (-agent PATH runs a prebuilt berth-agent).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
	"github.com/berth-dev/berth/services/scheduler"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench-container: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	n := flag.Int("n", 50, "runs per variant")
	prebuilt := flag.String("agent", "", "a static berth-agent to run instead of one built from ./cmd/berth-agent")
	flag.Parse()
	if os.Geteuid() != 0 {
		return errors.New("run as root: the agents run as nobody and Docker needs root")
	}
	repo, err := os.Getwd()
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "berth-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if err := os.Chmod(work, 0o755); err != nil {
		return err
	}
	agentBinary := filepath.Join(work, "berth-agent")
	if *prebuilt != "" {
		data, err := os.ReadFile(*prebuilt)
		if err != nil {
			return fmt.Errorf("cannot read -agent: %w", err)
		}
		if err := os.WriteFile(agentBinary, data, 0o755); err != nil {
			return err
		}
	} else {
		build := exec.Command("go", "build", "-trimpath", "-o", agentBinary, "./cmd/berth-agent")
		build.Dir, build.Env = repo, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("cannot build berth-agent: %v\n%s", err, out)
		}
	}
	cli, err := client.New(client.FromEnv)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx := context.Background()
	image, err := imagectl.Ensure(ctx, cli, imagectl.AgentImage{AgentBinary: agentBinary})
	if err != nil {
		return err
	}

	stateDir := filepath.Join(work, "state")
	cfgPath := filepath.Join(work, "berth.toml")
	cfgText := fmt.Sprintf(`[providers]
primary = "local"

[[agents]]
id = "cold"
[agents.container_mode]
enabled = true
network = "none"
image = %[1]q

[[agents]]
id = "warm"
[agents.container_mode]
enabled = true
network = "none"
image = %[1]q
warm = 1

[scheduler]
run_as = "nobody"
agent_binary = %[2]q
`, image, agentBinary)
	if err := os.WriteFile(cfgPath, []byte(cfgText), 0o644); err != nil {
		return err
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	steps := &stepLog{}
	// Two schedulers, one per way of ending: the container's end in the
	// run's path, and after the reply (berth-scheduler's).
	type variant struct {
		backend *container.Backend
		svc     *scheduler.Service
	}
	var variants [2]variant
	for i, background := range []bool{false, true} {
		dir := stateDir + []string{"", "-bg"}[i]
		backend, err := container.New(container.Options{Client: cli, Instance: dir, Logger: slog.New(steps), RemoveInBackground: background})
		if err != nil {
			return err
		}
		svc, err := scheduler.New(cfg, dir, scheduler.Options{Backends: map[string]isolation.Backend{container.Name: backend}, Logger: quiet})
		if err != nil {
			return err
		}
		defer svc.Close()
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- svc.Run(runCtx) }()
		defer func() { stop(); <-done }()
		variants[i] = variant{backend, svc}
	}

	dockerWS := filepath.Join(work, "docker-ws")
	if err := os.Mkdir(dockerWS, 0o700); err != nil {
		return err
	}
	if err := os.Chown(dockerWS, 65534, 65534); err != nil {
		return err
	}

	fmt.Fprintf(os.Stderr, "==> %d runs each of docker run, cold and warm, each ending its container before and after the reply (image %s, %d CPUs)\n", *n, image, runtime.NumCPU())
	names := []string{"docker", "cold", "warm", "cold-bg", "warm-bg"}
	read, finished := map[string][]time.Duration{}, map[string][]time.Duration{}
	answered := map[string][]time.Duration{} // Submit → the agent's "response follows" line
	for i := range *n + 1 {
		for _, name := range names {
			var r, f, a time.Duration
			var err error
			v := variants[0]
			if strings.HasSuffix(name, "-bg") {
				v = variants[1]
			}
			// What the runs before left to do in the background (refill a
			// pool, end a container) is not this message's cost: every
			// message starts on an engine done with them.
			for _, before := range variants {
				if err := waitPool(before.backend, "warm", 1); err != nil {
					return err
				}
				settleCtx, cancel := context.WithTimeout(ctx, time.Minute)
				err = before.backend.Settle(settleCtx)
				cancel()
				if err != nil {
					return fmt.Errorf("%s: the runs before did not end: %w", name, err)
				}
			}
			switch agent := strings.TrimSuffix(name, "-bg"); agent {
			case "docker":
				r, f, err = viaDockerRun(image, dockerWS, i)
			default:
				r, a, f, err = viaScheduler(v.svc, agent, i)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if i == 0 {
				continue // the first of each warms caches (image, engine info)
			}
			read[name], finished[name] = append(read[name], r), append(finished[name], f)
			if a > 0 {
				answered[name] = append(answered[name], a)
			}
		}
		if i == 0 {
			steps.reset()
		}
	}
	dr, _ := stats(read["docker"])
	df, _ := stats(finished["docker"])
	fmt.Printf("Submit (or docker run) → berth-agent read its request, and → the run's end (reply stored; docker run: exit), %d runs each, %d CPUs; each message starts once the warm pools are full and earlier runs' containers are gone\n\n", *n, runtime.NumCPU())
	fmt.Printf("| path | request read: median | p95 | median vs docker run | run ended: median | p95 | median vs docker run |\n|---|---|---|---|---|---|---|\n")
	for _, row := range []struct{ name, label string }{
		{"docker", "`docker run --rm -i` (same image and flags)"},
		{"cold", "berth cold (fresh container per message)"},
		{"warm", "berth warm (`container_mode.warm = 1`)"},
		{"cold-bg", "berth cold, container ended after the reply (berth-scheduler)"},
		{"warm-bg", "berth warm, container ended after the reply (berth-scheduler)"},
	} {
		rm, rp := stats(read[row.name])
		fm, fp := stats(finished[row.name])
		fmt.Printf("| %s | %s | %s | %.0f %% | %s | %s | %.0f %% |\n", row.label, ms(rm), ms(rp), 100*float64(rm)/float64(dr), ms(fm), ms(fp), 100*float64(fm)/float64(df))
	}
	fmt.Printf("\nWhere a berth run's time goes (medians): Submit → request read → the agent's last log line (%q, written right before its response; — when this berth-agent does not write it) → the run's end:\n\n", isolation.ResponseFollows)
	fmt.Printf("| path | request read | agent answered | run ended |\n|---|---|---|---|\n")
	for _, name := range names[1:] {
		rm, _ := stats(read[name])
		fm, _ := stats(finished[name])
		am := "—"
		if len(answered[name]) == len(finished[name]) {
			m, _ := stats(answered[name])
			am = ms(m)
		}
		fmt.Printf("| %s | %s | %s | %s |\n", name, ms(rm), am, ms(fm))
	}
	fmt.Printf("\nThe container backend's steps (medians, ms; debug lines of isolation/container):\n\n")
	fmt.Printf("| step | cold | warm |\n|---|---|---|\n")
	for _, key := range []string{"prepare_ms", "create_ms", "attach_ms", "start_ms", "total_ms"} {
		fmt.Printf("| %s | %s | %s |\n", strings.TrimSuffix(key, "_ms"), steps.median("cold", key), steps.median("warm", key))
	}
	fmt.Printf("| remove | %s | %s |\n", steps.median("", "remove_ms"), "(same)")
	fmt.Printf("\nremove is in the run's path (before its end) unless the container is ended after the reply.\n")
	return nil
}

// viaScheduler submits one message and returns how long it took until the
// agent read it, until it answered (0 when it does not log that) and until
// the run ended (its reply stored).
func viaScheduler(svc *scheduler.Service, agent string, i int) (read, answered, ended time.Duration, err error) {
	start := time.Now()
	id, err := svc.Submit(busapi.Submission{
		MessageID: fmt.Sprintf("bench-%s-%d-%d", agent, i, start.UnixNano()), Agent: agent,
		Connector: "bench", Channel: "bench", Author: "bench", Text: "/sh true",
	})
	if err != nil {
		return 0, 0, 0, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := svc.GetRun(id)
		if err != nil {
			return 0, 0, 0, err
		}
		if scheduler.Finished(r.State) {
			if r.State != scheduler.StateSucceeded {
				return 0, 0, 0, fmt.Errorf("run %s %s: %s", id, r.State, r.Reason)
			}
			at, err := logTime(r.StderrTail, "confined with Landlock")
			if err != nil {
				return 0, 0, 0, err
			}
			if done, err := logTime(r.StderrTail, isolation.ResponseFollows); err == nil {
				answered = done.Sub(start)
			}
			return at.Sub(start), answered, r.FinishedAt.Sub(start), nil
		}
		if time.Now().After(deadline) {
			return 0, 0, 0, fmt.Errorf("run %s did not finish within a minute", id)
		}
		time.Sleep(time.Millisecond)
	}
}

// stepLog is a slog handler that keeps the container backend's timing
// lines: what each engine call of a run took.
type stepLog struct {
	mu    sync.Mutex
	lines []map[string]any
}

func (l *stepLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *stepLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *stepLog) WithGroup(string) slog.Handler            { return l }

func (l *stepLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "container has its request" && r.Message != "container removed" {
		return nil
	}
	line := map[string]any{}
	r.Attrs(func(a slog.Attr) bool {
		line[a.Key] = a.Value.Any()
		return true
	})
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
	return nil
}

func (l *stepLog) reset() {
	l.mu.Lock()
	l.lines = nil
	l.mu.Unlock()
}

// median is the median of key over the lines of agent ("" for any).
func (l *stepLog) median(agent, key string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var vs []float64
	for _, line := range l.lines {
		if a, _ := line["agent"].(string); agent != "" && a != agent {
			continue
		}
		if v, ok := line[key].(float64); ok {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return "—"
	}
	slices.Sort(vs)
	return fmt.Sprintf("%.1f", vs[len(vs)/2])
}

// viaDockerRun runs the same request through the docker CLI with the flags
// the backend gives its containers.
func viaDockerRun(image, workspace string, i int) (time.Duration, time.Duration, error) {
	id := fmt.Sprintf("bench-docker-%d", i)
	c := config.Container{Network: "none"}
	req, _ := json.Marshal(agentproto.Request{
		Version: agentproto.Version, RunID: id,
		Agent:     agentproto.Agent{ID: "docker", MaxIterations: 3},
		Message:   agentproto.Message{ID: id, Author: "bench", Text: "/sh true"},
		Provider:  agentproto.Provider{Name: "local", Kind: "local"},
		Policy:    isolation.ContainerPolicy(c.Network != "none"),
		Workspace: config.ContainerWorkspace,
	})
	args := []string{"run", "--rm", "-i", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		"--memory", "512m", "--memory-swap", "512m", "--pids-limit", "256", "--cpus", "1", "--network", "none",
		"--tmpfs", config.ContainerTmp + ":rw,nosuid,nodev,size=256m,mode=1777",
		"-v", workspace + ":" + config.ContainerWorkspace + ":rw", "-w", config.ContainerWorkspace,
		"-u", "65534:65534", "--log-driver", "none"}
	for _, e := range container.Environment() {
		args = append(args, "-e", e)
	}
	args = append(args, image)
	cmd := exec.Command("docker", args...)
	cmd.Stdin = bytes.NewReader(req)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, 0, fmt.Errorf("%v: %s", err, stderr.String())
	}
	exited := time.Since(start)
	read, err := logTime(stderr.String(), "confined with Landlock")
	return read.Sub(start), exited, err
}

// logTime finds the time of berth-agent's log line msg: "confined with
// Landlock" is written right after it read and applied its request.
func logTime(stderr, msg string) (time.Time, error) {
	sc := bufio.NewScanner(strings.NewReader(stderr))
	for sc.Scan() {
		var line struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == msg {
			return line.Time, nil
		}
	}
	return time.Time{}, fmt.Errorf("no %q line in the agent's stderr", msg)
}

func waitPool(b *container.Backend, agent string, size int) error {
	deadline := time.Now().Add(time.Minute)
	for b.PoolSize(agent) < size {
		if time.Now().After(deadline) {
			return fmt.Errorf("the warm pool of %s did not fill within a minute", agent)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

func stats(ds []time.Duration) (median, p95 time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[(len(s)*95+99)/100-1]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
