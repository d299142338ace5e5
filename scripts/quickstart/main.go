// Command quickstart builds berth, starts the suite locally exactly as
// systemd would (private system bus with units/dbus, berth-scheduler
// D-Bus-activated, berth-intake socket-activated), posts one signed webhook
// message, prints the agent's reply and the run as berthctl shows it, then
// stops everything it started. With --isolation container the demo agent runs
// in a fresh Docker container per message, from an image built offline. Run
// it through scripts/quickstart.sh.
package main

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/testkit/devstack"
)

// demoMessage shows the sandbox at work: the offline local provider runs the
// command with the shell tool, as the agent's own unprivileged uid (from
// [scheduler] agent_uids: a number with no name), in the agent's
// workspace, and Landlock keeps it from berth's own (world-readable) config.
const demoMessage = `/sh echo "I am uid $(id -u), working in $(pwd)"; echo "reading berth's config:"; cat %s`

// egressUser runs the demo's egress proxy, which holds the provider key: an
// unprivileged system user every Debian and Fedora system has, so the
// quickstart creates none (a package install makes berth-egress).
const egressUser = "daemon"

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "quickstart: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	keep := flag.Bool("keep", false, "keep the working directory (config, state, logs)")
	timeout := flag.Duration("timeout", 2*time.Minute, "how long to wait for the reply")
	isolationFlag := flag.String("isolation", "landlock", `how the demo agent is isolated: "landlock" or "container" (needs Docker)`)
	flag.Parse()
	if *isolationFlag != "landlock" && *isolationFlag != "container" {
		return fmt.Errorf(`--isolation %q: want "landlock" or "container"`, *isolationFlag)
	}
	message := ""
	if flag.NArg() > 0 {
		message = flag.Arg(0)
	}

	repo, err := os.Getwd()
	if err != nil {
		return err
	}
	work, err := workDir()
	if err != nil {
		return err
	}
	if !*keep {
		defer os.RemoveAll(work)
	}
	// The agent runs as an unprivileged user: it must reach bin/ and the state.
	if err := os.Chmod(work, 0o755); err != nil {
		return err
	}
	binDir := filepath.Join(work, "bin")
	fmt.Fprintf(os.Stderr, "==> building berth into %s\n", binDir)
	if err := devstack.Build(repo, binDir); err != nil {
		return err
	}

	// The reply server stands in for the chat platform: intake POSTs the
	// agent's reply here, signed like incoming webhooks.
	secret := make([]byte, 24)
	_, _ = rand.Read(secret)
	secretHex := hex.EncodeToString(secret)
	replies := make(chan map[string]any, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		ts := r.Header.Get("X-Berth-Timestamp")
		_, want := devstack.SignAt([]byte(secretHex), ts, body)
		if !hmac.Equal([]byte(want), []byte(r.Header.Get("X-Berth-Signature"))) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		var reply map[string]any
		if err := json.Unmarshal(body, &reply); err != nil {
			http.Error(w, "bad json", http.StatusBadRequest)
			return
		}
		select {
		case replies <- reply:
		default:
		}
		w.WriteHeader(http.StatusOK)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	runAs := "nobody"
	if os.Geteuid() != 0 {
		if u, err := user.Current(); err == nil {
			runAs = u.Username
		}
	}
	providers, remote, env := demoProvider(os.Getenv)
	if remote && os.Geteuid() == 0 {
		if _, err := user.Lookup(egressUser); err != nil {
			return fmt.Errorf("the demo's egress proxy runs as user %s, which this system lacks (create it, e.g. useradd --system %s): %w", egressUser, egressUser, err)
		}
	}
	agentExtra := ""
	if *isolationFlag == "container" {
		image, err := buildAgentImage(filepath.Join(binDir, "berth-agent"))
		if err != nil {
			return err
		}
		// network none with a real provider too: its one way out is the
		// run's egress socket.
		agentExtra = fmt.Sprintf("[agents.container_mode]\nenabled = true\nimage = %q\nnetwork = \"none\"\n", image)
	}
	cfg := demoConfig(providers, agentExtra, secretHex, ln.Addr().String(), runAs, filepath.Join(binDir, "berth-agent"))

	fmt.Fprintln(os.Stderr, "==> starting the suite: private system bus (scheduler D-Bus-activated), intake socket-activated")
	stack, err := devstack.Start(devstack.Options{BinDir: binDir, Dir: filepath.Join(work, "suite"), Config: cfg, Env: env})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(os.Stderr, "==> stopping the suite")
		stack.Stop()
	}()
	if message == "" {
		message = fmt.Sprintf(demoMessage, stack.ConfigPath)
		if remote { // a real model: ask it something it can answer with its tools
			message = "Hello! Who are you, and which user do you run as on this host? Use your shell tool to find out."
		}
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, *timeout)
	defer cancelTimeout()

	body, _ := json.Marshal(map[string]string{"channel": "quickstart", "author": "you", "text": message})
	fmt.Fprintf(os.Stderr, "==> POST %s/hooks/webhook  %s\n", stack.IntakeURL, body)
	resp, err := stack.Post(ctx, "webhook", []byte(secretHex), body)
	if err != nil {
		return fmt.Errorf("cannot post the message: %w", err)
	}
	respBody, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Fprintf(os.Stderr, "<== %s %s\n", resp.Status, respBody)
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("intake refused the message (logs in %s)", stack.IntakeLog)
	}

	var reply map[string]any
	select {
	case reply = <-replies:
	case <-ctx.Done():
		return fmt.Errorf("no reply within %s: see %s and %s", *timeout, stack.IntakeLog, stack.Bus.LogPath)
	}
	fmt.Println("\n--- agent reply ---")
	fmt.Println(reply["text"])
	if e, _ := reply["error"].(string); e != "" {
		fmt.Println("error:", e)
	}

	runID, _ := reply["run_id"].(string)
	fmt.Printf("\n--- berthctl runs show %s ---\n", runID)
	ctl := exec.Command(filepath.Join(binDir, "berthctl"), "runs", "show", runID)
	ctl.Env = append(os.Environ(), "DBUS_SYSTEM_BUS_ADDRESS="+stack.Bus.Address)
	ctl.Stdout, ctl.Stderr = os.Stdout, os.Stderr
	if err := ctl.Run(); err != nil {
		return fmt.Errorf("berthctl runs show: %w", err)
	}
	if *keep {
		fmt.Fprintf(os.Stderr, "==> kept %s\n", work)
	}
	return nil
}

// egressSocketTail is what follows the working directory in a run's egress
// socket path: /suite/state/scheduler/egress/<36-byte run id>-<attempt>/egress.sock
// (an attempt of up to two digits).
const egressSocketTail = len("/suite/state/scheduler/egress/") + 36 + len("-99") + len("/egress.sock")

// workDir makes the quickstart's working directory, short enough that the
// runs' egress socket paths fit a Unix socket address (107 bytes), and
// outside /tmp, /var/tmp and /run: a confined host run has those of its own,
// so berth's config under them would only be missing from the sandbox, not
// refused by Landlock as the demo shows. As root under /var/lib, else in
// the user's cache directory; /tmp only when neither can be used.
func workDir() (string, error) {
	var parents []string
	if os.Geteuid() == 0 {
		parents = append(parents, "/var/lib")
	}
	if cache, err := os.UserCacheDir(); err == nil {
		parents = append(parents, cache)
	}
	for _, parent := range append(parents, os.TempDir(), "/tmp") {
		if len(parent)+len("/berth-1234567890")+egressSocketTail > 107 {
			continue
		}
		if err := os.MkdirAll(parent, 0o755); err != nil {
			continue
		}
		if work, err := os.MkdirTemp(parent, "berth-"); err == nil {
			return work, nil
		}
	}
	return "", errors.New("cannot make a working directory short enough for the runs' egress sockets under /var/lib, the cache directory or /tmp")
}

// buildAgentImage builds the berth-agent image offline (FROM scratch, the
// static berth-agent and busybox-static) unless the engine has it already.
func buildAgentImage(agentBinary string) (string, error) {
	fmt.Fprintln(os.Stderr, "==> building the agent image offline (FROM scratch: berth-agent + busybox-static)")
	cli, err := client.New(client.FromEnv)
	if err != nil {
		return "", fmt.Errorf("cannot create Docker client: %w", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tag, err := imagectl.Ensure(ctx, cli, imagectl.AgentImage{AgentBinary: agentBinary})
	if err != nil {
		return "", fmt.Errorf("cannot build the agent image (is Docker running? scripts/quickstart.sh starts it): %w", err)
	}
	fmt.Fprintf(os.Stderr, "==> agent image %s\n", tag)
	return tag, nil
}

// demoProvider picks the demo agent's provider from the environment:
// OPENAI_API_KEY or OPENAI_BASE_URL (with OPENAI_MODEL), else
// ANTHROPIC_API_KEY or ANTHROPIC_BASE_URL (with ANTHROPIC_MODEL), else the
// offline "local" provider; with both set, OpenAI wins. remote says a real
// provider was picked. The demo agent keeps no network of its own either
// way: it reaches a real provider through its run's egress proxy, and the
// key reaches the scheduler through its environment (api_key_env) and from
// there only the proxy, never the sandbox.
func demoProvider(getenv func(string) string) (providers string, remote bool, env []string) {
	for _, p := range []struct{ kind, prefix, model string }{
		{"openai", "OPENAI", "gpt-4o-mini"},
		{"anthropic", "ANTHROPIC", "claude-haiku-4-5"},
	} {
		key, base := getenv(p.prefix+"_API_KEY"), getenv(p.prefix+"_BASE_URL")
		if key == "" && base == "" {
			continue
		}
		model := getenv(p.prefix + "_MODEL")
		if model == "" {
			model = p.model
		}
		var b strings.Builder
		fmt.Fprintf(&b, "[providers]\nprimary = %q\n\n[providers.%s]\nkind = %q\nmodel = %q\n", p.kind, p.kind, p.kind, model)
		if base != "" {
			fmt.Fprintf(&b, "base_url = %q\n", base)
		}
		if key != "" {
			fmt.Fprintf(&b, "api_key_env = %q\n", p.prefix+"_API_KEY")
			env = append(env, p.prefix+"_API_KEY="+key)
		}
		fmt.Fprintf(os.Stderr, "==> demo agent uses %s (model %s) through its run's egress proxy (as user %s; the sandbox has no network and no key)\n", p.kind, model, egressUser)
		return b.String(), true, env
	}
	return "[providers]\nprimary = \"local\"\n", false, nil
}

// demoConfig is the suite's berth.toml: the providers and the demo agent's
// extra settings from demoProvider, a webhook connector whose replies go to
// replyAddr (host:port), and the scheduler running agentBinary as runAs
// (agents get their own uids from [scheduler] agent_uids) and the egress
// proxy, berth-egress beside it, as egressUser.
func demoConfig(providers, agentExtra, secretHex, replyAddr, runAs, agentBinary string) string {
	return fmt.Sprintf(`# written by scripts/quickstart.sh
%s
[[agents]]
id = "demo"
name = "Demo agent"
max_iterations = 5
%s
[intake]
default_agent = "demo"

[[connectors]]
id = "webhook"
type = "webhook"
secret = %q
reply_url = "http://%s/reply"

[scheduler]
run_as = %q
agent_binary = %q
egress_user = %q
%s`, providers, agentExtra, secretHex, replyAddr, runAs, agentBinary, egressUser, rlimitFallback())
}

// rlimitFallback is the quickstart's allow_rlimit_fallback: a scheduler
// that is not root can make no cgroup for its runs, and without systemd
// its runs would fail closed; the demo accepts per-process rlimits then
// and says so.
func rlimitFallback() string {
	if os.Geteuid() == 0 {
		return ""
	}
	return "# not root: no cgroup per run, so per-process rlimits (see berthctl sandbox explain)\nallow_rlimit_fallback = true\n"
}
