// Command bench-container measures how long a message waits for its
// container: from Submit to berth-agent having read its request (the time of
// its "confined with Landlock" log line, written right after the read), for
// a cold container agent, a warm one (container_mode.warm = 1) and, in the
// same run, `docker run --rm -i` of the same image with the same flags. It
// prints median and p95 of each. Run it through scripts/bench-container.sh.
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
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/agentproto"
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
	build := exec.Command("go", "build", "-trimpath", "-o", agentBinary, "./cmd/berth-agent")
	build.Dir, build.Env = repo, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("cannot build berth-agent: %v\n%s", err, out)
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
	backend, err := container.New(container.Options{Client: cli, Instance: stateDir, Logger: quiet})
	if err != nil {
		return err
	}
	svc, err := scheduler.New(cfg, stateDir, scheduler.Options{Backends: map[string]isolation.Backend{container.Name: backend}, Logger: quiet})
	if err != nil {
		return err
	}
	defer svc.Close()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	defer func() { stop(); <-done }()

	dockerWS := filepath.Join(work, "docker-ws")
	if err := os.Mkdir(dockerWS, 0o700); err != nil {
		return err
	}
	if err := os.Chown(dockerWS, 65534, 65534); err != nil {
		return err
	}

	fmt.Fprintf(os.Stderr, "==> %d runs each of docker run, cold and warm (image %s, %d CPUs)\n", *n, image, runtime.NumCPU())
	var dockerRun, cold, warm []time.Duration
	for i := range *n + 1 {
		d, err := viaDockerRun(image, dockerWS, i)
		if err != nil {
			return fmt.Errorf("docker run: %w", err)
		}
		c, err := viaScheduler(svc, "cold", i)
		if err != nil {
			return fmt.Errorf("cold: %w", err)
		}
		if err := waitPool(backend, "warm", 1); err != nil {
			return err
		}
		w, err := viaScheduler(svc, "warm", i)
		if err != nil {
			return fmt.Errorf("warm: %w", err)
		}
		if i == 0 {
			continue // the first of each warms caches (image, engine info)
		}
		dockerRun, cold, warm = append(dockerRun, d), append(cold, c), append(warm, w)
	}
	dm, dp := stats(dockerRun)
	cm, cp := stats(cold)
	wm, wp := stats(warm)
	fmt.Printf("Submit (or docker run) → berth-agent read its request, %d runs each, %d CPUs\n\n", *n, runtime.NumCPU())
	fmt.Printf("| path | median | p95 | median vs docker run |\n|---|---|---|---|\n")
	fmt.Printf("| `docker run --rm -i` (same image and flags) | %s | %s | 100 %% |\n", ms(dm), ms(dp))
	fmt.Printf("| berth cold (fresh container per message) | %s | %s | %.0f %% |\n", ms(cm), ms(cp), 100*float64(cm)/float64(dm))
	fmt.Printf("| berth warm (container_mode.warm = 1) | %s | %s | %.0f %% |\n", ms(wm), ms(wp), 100*float64(wm)/float64(dm))
	return nil
}

// viaScheduler submits one message and returns how long it took until the
// agent read it.
func viaScheduler(svc *scheduler.Service, agent string, i int) (time.Duration, error) {
	start := time.Now()
	id, err := svc.Submit(map[string]string{
		"id": fmt.Sprintf("bench-%s-%d-%d", agent, i, start.UnixNano()), "agent": agent,
		"connector": "bench", "channel": "bench", "author": "bench", "text": "/sh true",
	})
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := svc.GetRun(id)
		if err != nil {
			return 0, err
		}
		if scheduler.Finished(r.State) {
			if r.State != scheduler.StateSucceeded {
				return 0, fmt.Errorf("run %s %s: %s", id, r.State, r.Reason)
			}
			read, err := requestRead(strings.NewReader(r.StderrTail))
			return read.Sub(start), err
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("run %s did not finish within a minute", id)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// viaDockerRun runs the same request through the docker CLI with the flags
// the backend gives its containers.
func viaDockerRun(image, workspace string, i int) (time.Duration, error) {
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
		"--tmpfs", config.ContainerTmp + ":rw,nosuid,nodev,size=" + container.TmpfsSize + ",mode=1777",
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
		return 0, fmt.Errorf("%v: %s", err, stderr.String())
	}
	read, err := requestRead(&stderr)
	return read.Sub(start), err
}

// requestRead finds the time berth-agent logged right after reading and
// applying its request.
func requestRead(stderr io.Reader) (time.Time, error) {
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		var line struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "confined with Landlock" {
			return line.Time, nil
		}
	}
	return time.Time{}, errors.New("no \"confined with Landlock\" line in the agent's stderr")
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
