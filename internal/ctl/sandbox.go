package ctl

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
	"github.com/berth-dev/berth/isolation/hostrun"
)

// sandbox handles `berthctl sandbox explain [--config FILE] AGENT`: the
// effective isolation of an agent, read from the config alone.
func (c *cli) sandbox(args []string) error {
	const use = "usage: berthctl sandbox explain [--config FILE] AGENT"
	if len(args) == 0 || args[0] != "explain" {
		return usageError(use)
	}
	fs := newFlags("sandbox explain")
	path := fs.String("config", "", "config file")
	if err := fs.Parse(args[1:]); err != nil {
		return usageError("%v", err)
	}
	if fs.NArg() != 1 {
		return usageError(use)
	}
	p := firstOf(*path, os.Getenv("BERTH_CONFIG"), config.DefaultPath)
	cfg, err := config.Load(p)
	if err != nil {
		fmt.Fprintln(c.errOut, err)
		return &exitErr{ExitFailed, fmt.Sprintf("config %s is not valid (berthctl config check --config %s)", p, p)}
	}
	a, err := cfg.Agent(fs.Arg(0))
	if err != nil {
		return &exitErr{ExitFailed, err.Error()}
	}
	explain(c.out, cfg, a)
	return nil
}

func firstOf(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}

// explain writes what isolates agent a and why.
func explain(w io.Writer, cfg *config.Config, a config.Agent) {
	line := func(key, format string, args ...any) {
		if key != "" {
			key += ":"
		}
		fmt.Fprintf(w, "%-10s %s\n", key, fmt.Sprintf(format, args...))
	}
	workspace := a.Workspace
	if workspace == "" {
		workspace = "<state dir>/agents/" + a.ID + " (default)"
	}
	line("agent", "%s", a.ID)
	line("timeout", "%s (then the sandbox is killed: reason %q)", a.Timeout, isolation.ReasonTimeout)
	switch a.Isolation {
	case container.Name:
		c := a.Container
		line("backend", "container — container_mode.enabled = true: a fresh Docker container per message, removed afterwards")
		if c.Image != "" {
			line("image", "%s (container_mode.image; must be in the engine, no registry is used)", c.Image)
		} else {
			line("image", "berth-agent:<content hash> built locally from %s and busybox-static (FROM scratch)", cfg.Scheduler.AgentBinary)
		}
		runtime := c.Runtime
		if runtime == "" {
			runtime = "the engine's default (container_mode.runtime unset)"
		}
		line("runtime", "%s", runtime)
		line("user", "uid:gid of %s (run_as; never root)", cfg.Scheduler.RunAs)
		line("limits", "memory %s with no extra swap, %d pids, 1 CPU", c.MemoryLimit, container.DefaultPidsLimit)
		switch c.Network {
		case "none":
			line("network", "none — no interface but loopback; Landlock denies TCP as well")
		default:
			line("network", "%s — outbound through the engine's bridge; no published ports", c.Network)
		}
		line("rootfs", "read-only; capabilities: none; no-new-privileges; %s", strings.Join(append([]string{"default seccomp"}, c.SecurityOpt...), ", "))
		line("mounts", "%s → %s (rw, HOME, working directory)", workspace, config.ContainerWorkspace)
		line("", "tmpfs %s (%s, TMPDIR; gone after the run)", config.ContainerTmp, container.TmpfsSize)
		for _, b := range c.Binds {
			line("", "%s (container_mode.binds)", b)
		}
		line("inside", "berth-agent confines itself with Landlock: /workspace and /tmp read-write, the system set read-only")
		if c.Warm > 0 {
			line("warm", "%d started container(s) kept waiting on stdin (container_mode.warm); a message takes one, which is removed after it, and a replacement starts", c.Warm)
		} else {
			line("warm", "none (container_mode.warm = 0): each message creates and starts its container")
		}
	case "unrestricted":
		line("backend", "unrestricted — file_access.unrestricted = true: a plain host process with NO file confinement (logged on every run)")
		line("user", "%s", cfg.Scheduler.RunAs)
		line("network", "%s", hostNetwork(a.FileAccess.AllowNetwork))
	default:
		fa := a.FileAccess
		line("backend", "landlock — the default: berth-agent confines itself with Landlock on the host (container_mode.enabled is false)")
		line("user", "%s (run_as; never root)", cfg.Scheduler.RunAs)
		line("network", "%s", hostNetwork(fa.AllowNetwork))
		line("files", "%s read-write", workspace)
		line("", "system set read-only (/usr, /bin, /lib*, a few /etc files; never /etc/shadow)")
		if len(fa.AllowReadWrite) > 0 {
			line("", "%s read-write (file_access.allow_read_write)", strings.Join(fa.AllowReadWrite, ", "))
		}
		if len(fa.AllowRead) > 0 {
			line("", "%s read-only (file_access.allow_read)", strings.Join(fa.AllowRead, ", "))
		}
		if len(fa.Deny) > 0 {
			line("", "%s denied (file_access.deny)", strings.Join(fa.Deny, ", "))
		}
		line("", "berth's config, state and other agents' workspaces denied")
		explainHostLimits(line, cfg, a)
	}
}

// explainHostLimits writes which limits hold for a host run on this machine
// and the Landlock policy the agent applies (computed for the default state
// directory when the scheduler's own is unknown here).
func explainHostLimits(line func(key, format string, args ...any), cfg *config.Config, a config.Agent) {
	conf := hostrun.Runner{}.Explain(a.Timeout, a.FileAccess.AllowNetwork)
	line("limits", "%s on this machine:", conf.Mode)
	for _, h := range conf.Holds {
		line("", "holds: %s", h)
	}
	for _, m := range conf.Missing {
		line("", "missing: %s", m)
	}
	base := firstOf(os.Getenv("BERTH_STATE_DIR"), "/var/lib/berth")
	stateDir := filepath.Join(base, "scheduler")
	workspace := firstOf(a.Workspace, filepath.Join(stateDir, "agents", a.ID))
	protect := []string{stateDir, filepath.Join(base, "intake")}
	for _, src := range cfg.Sources {
		protect = append(protect, filepath.Dir(src))
	}
	for _, c := range cfg.Connectors {
		if c.SecretFile != "" {
			protect = append(protect, c.SecretFile)
		}
	}
	pol := isolation.HostPolicy(a, workspace, protect)
	line("policy", "read-write: %s", strings.Join(pol.AllowReadWrite, " "))
	line("", "read-only:  %s", strings.Join(pol.AllowRead, " "))
	line("", "denied:     %s (and what %s holds besides the workspace, listed per run)", strings.Join(pol.Deny, " "), stateDir)
}

func hostNetwork(allowed bool) string {
	if allowed {
		return "allowed (file_access.allow_network = true)"
	}
	return "none — an empty network namespace and Landlock TCP deny (file_access.allow_network = false)"
}
