package ctl

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
)

const sandboxUsage = "usage: berthctl sandbox explain [--json] [--probe] AGENT"

// mcpProbeTimeout bounds --probe: a run's start, egress proxy and each MCP
// server's start (the scheduler's own bound is 90 s).
const mcpProbeTimeout = 2 * time.Minute

// sandbox handles `berthctl sandbox explain [--json] [--probe] AGENT`: the
// plan the running scheduler would use for the agent's next run, asked over
// D-Bus, so what the admin sees is what runs; --probe asks the agent's MCP
// servers for their tools through a real run.
func (c *cli) sandbox(args []string) error {
	if len(args) == 0 || args[0] != "explain" {
		return usageError(sandboxUsage)
	}
	fs := newFlags("sandbox explain")
	asJSON := fs.Bool("json", false, "print the plan as JSON")
	probe := fs.Bool("probe", false, "ask each MCP server for its tools, through a real run of the agent")
	if err := fs.Parse(args[1:]); err != nil {
		return usageError("%v", err)
	}
	if fs.NArg() != 1 {
		return usageError(sandboxUsage)
	}
	sched, err := c.scheduler()
	if err != nil {
		return err
	}
	e, err := sched.ExplainAgent(context.Background(), fs.Arg(0))
	if err != nil {
		return fmt.Errorf("cannot ask the scheduler for the plan of %s: %w", fs.Arg(0), err)
	}
	var probed []busapi.MCPStatus
	if *probe {
		ctx, cancel := context.WithTimeout(context.Background(), mcpProbeTimeout)
		defer cancel()
		if probed, err = sched.ProbeMCP(ctx, fs.Arg(0)); err != nil {
			return fmt.Errorf("cannot probe the MCP servers of %s: %w", fs.Arg(0), err)
		}
	}
	if *asJSON {
		if *probe {
			return writeJSON(c.out, struct {
				busapi.Explanation
				MCPProbe []busapi.MCPStatus `json:"mcp_probe"`
			}{e, probed})
		}
		return writeJSON(c.out, e)
	}
	explain(c.out, e)
	if *probe {
		if len(probed) == 0 {
			fmt.Fprintln(c.out, "\nmcp probe: the agent has no MCP servers")
		} else {
			writeMCPServers(c.out, "mcp probe (each server asked through a real run):", probed)
		}
	}
	if len(e.Problems) > 0 {
		return &exitErr{ExitFailed, fmt.Sprintf("runs of %s would fail: %s", fs.Arg(0), strings.Join(e.Problems, "; "))}
	}
	return nil
}

// explain writes what isolates a run and why, for a human.
func explain(w io.Writer, e busapi.Explanation) {
	p := e.Plan
	line := func(key, format string, args ...any) {
		if key != "" {
			key += ":"
		}
		fmt.Fprintf(w, "%-10s %s\n", key, fmt.Sprintf(format, args...))
	}
	why := func(key string) string { return e.Why[key] }
	line("agent", "%s", p.AgentID)
	line("backend", "%s", why("backend"))
	if !e.BackendAvailable {
		line("", "NOT AVAILABLE in this scheduler: runs fail")
	}
	if w := why("timeout"); w != "" {
		line("timeout", "%s", w)
	} else {
		line("timeout", "%s", p.Timeout)
	}
	line("user", "%s", why("user"))
	line("network", "%s", why("network"))
	if p.Network.Allowed {
		line("", "DIRECT NETWORK: an admin's opt-in, logged on every run; no egress proxy, no rules, and the provider keys go into the sandbox")
	}
	if w := why("egress"); w != "" {
		line("egress", "%s", w)
	}
	line("workspace", "%s (as %s inside)", p.Workspace, p.SandboxWorkspace)
	switch p.Backend {
	case busapi.BackendContainer:
		line("image", "%s", why("image"))
		line("runtime", "%s", why("runtime"))
		line("limits", "memory %s with no extra swap, %d pids, %g CPU, tmpfs /tmp %s",
			config.Bytes(p.Limits.MemoryBytes), p.Limits.Pids, float64(p.Limits.NanoCPUs)/1e9, config.Bytes(p.Limits.TmpfsBytes))
		line("rootfs", "read-only; capabilities: none; no-new-privileges; %s", strings.Join(append([]string{"default seccomp"}, p.Container.SecurityOpt...), ", "))
		for i, m := range p.Mounts {
			key := ""
			if i == 0 {
				key = "mounts"
			}
			mode := "rw"
			if m.ReadOnly {
				mode = "ro"
			}
			line(key, "%s → %s (%s)", m.Source, m.Target, mode)
		}
		line("inside", "%s", why("policy"))
		line("warm", "%s", why("warm"))
	default:
		line("limits", "%s", why("limits"))
		line("policy", "read-write: %s", strings.Join(p.Policy.AllowReadWrite, " "))
		line("", "read-only:  %s", strings.Join(p.Policy.AllowRead, " "))
		line("", "denied:     %s", strings.Join(p.Policy.Deny, " "))
		line("", "protected:  %s (berth's config, state, secrets and other agents' workspaces)", strings.Join(p.Protected, " "))
		if p.Policy.Unrestricted {
			line("", "UNRESTRICTED: no file confinement at all")
		}
	}
	if conf := e.Confinement; conf != nil {
		line("confined", "%s on this machine:", conf.Mode)
		for _, h := range conf.Holds {
			line("", "holds: %s", h)
		}
		for _, m := range conf.Missing {
			line("", "missing: %s", m)
		}
	}
	for i, server := range strings.Split(why("mcp"), "\n") {
		if server == "" {
			continue
		}
		key := ""
		if i == 0 {
			key = "mcp"
		}
		line(key, "%s", server)
	}
	if w := why("web_search"); w != "" {
		line("search", "%s", w)
	}
	for i, pr := range p.Providers {
		key := ""
		if i == 0 {
			key = "providers"
		}
		line(key, "%s (%s) %s %s", pr.Name, pr.Kind, pr.Model, pr.BaseURL)
	}
	for _, problem := range e.Problems {
		line("PROBLEM", "%s", problem)
	}
}
