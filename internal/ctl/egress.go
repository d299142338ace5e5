package ctl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
)

const egressUsage = "usage: berthctl egress explain [--method M] [--json] AGENT URL|HOST:PORT\n       berthctl egress explain --git fetch|push [--json] AGENT REMOTE [REF]"

// egress handles `berthctl egress explain [--method M] [--json] AGENT URL`:
// whether the egress proxy of AGENT's next run would let the request pass,
// and why, decided by the running scheduler with its current config.
// Exit status: 0 it would pass, 1 it would be refused, 2 the question is
// wrong (usage, a URL the proxy cannot decide, an unknown agent), 3 the
// scheduler cannot be reached.
func (c *cli) egress(args []string) error {
	if len(args) == 0 || args[0] != "explain" {
		return usageError(egressUsage)
	}
	fs := newFlags("egress explain")
	method := fs.String("method", "", "the request's method (default GET; CONNECT for a tunnel to HOST:PORT; https URLs are decided as CONNECT)")
	asJSON := fs.Bool("json", false, "print the verdict as JSON")
	gitOp := fs.String("git", "", "ask about git's smart HTTP instead: fetch of REMOTE, or push of REF (a branch or refs/heads/…) to it")
	pos, err := parseInterleaved(fs, args[1:])
	if err != nil {
		return usageError("%v", err)
	}
	if *gitOp != "" {
		return c.explainGit(*gitOp, pos, *asJSON)
	}
	if len(pos) != 2 {
		return usageError(egressUsage)
	}
	agent, target := pos[0], pos[1]
	m := strings.ToUpper(*method)
	if !strings.Contains(target, "://") && m == "" && isHostPort(target) {
		// A bare host:port is what a tunnel asks for.
		m = "CONNECT"
	}
	sched, err := c.scheduler()
	if err != nil {
		return err
	}
	v, err := sched.ExplainEgress(context.Background(), agent, m, target)
	if err != nil {
		switch bus.ErrorName(err) {
		case bus.ErrInvalidArgument, bus.ErrNotFound:
			return &exitErr{ExitUsage, fmt.Sprintf("cannot explain %s for %s: %v", target, agent, err)}
		}
		return fmt.Errorf("cannot ask the scheduler about the egress of %s: %w", agent, err)
	}
	if *asJSON {
		if err := writeJSON(c.out, v); err != nil {
			return err
		}
	} else {
		explainEgress(c.out, v)
	}
	if !v.Allowed {
		return &exitErr{ExitFailed, fmt.Sprintf("%s %s would be refused for %s", v.Method, target, agent)}
	}
	return nil
}

// explainEgress writes a verdict for a human: allowed by which rule, or
// refused with the reason the proxy's 403 would carry.
func explainEgress(w io.Writer, v busapi.EgressVerdict) {
	line := func(key, format string, args ...any) {
		if key != "" {
			key += ":"
		}
		fmt.Fprintf(w, "%-9s %s\n", key, fmt.Sprintf(format, args...))
	}
	line("agent", "%s", v.Agent)
	op, ref, isGit := busapi.ParseGitMethod(v.Method)
	if isGit {
		line("request", "%s", strings.TrimSpace(fmt.Sprintf("git %s %s %s", op, v.URL, ref)))
	} else {
		line("request", "%s %s", v.Method, v.URL)
	}
	if strings.HasPrefix(strings.ToLower(v.URL), "https://") && v.Method != "CONNECT" && !v.Direct && !isGit {
		line("", "%s", "an https request travels in a CONNECT tunnel: the tunnel to its host and port is what is decided")
	}
	switch {
	case v.Direct:
		line("verdict", "PASSES, unfiltered (DIRECT network, an admin's opt-in)")
	case v.Allowed:
		line("verdict", "ALLOWED by rule %s", v.Rule)
	case isGit:
		line("verdict", "REFUSED (the proxy answers with git's error report: git prints the reason)")
	default:
		line("verdict", "REFUSED (the proxy answers 403)")
	}
	line("reason", "%s", v.Reason)
	if v.Note != "" {
		line("note", "%s", v.Note)
	}
	line("network", "%s", v.Network)
}

// isHostPort says s is host:port and nothing else.
func isHostPort(s string) bool {
	_, port, err := net.SplitHostPort(s)
	return err == nil && port != "" && !strings.Contains(s, "/")
}

// parseInterleaved parses flags wherever they stand among the arguments
// (`explain AGENT URL --json` as well as `explain --json AGENT URL`) and
// returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// explainGit handles `berthctl egress explain --git fetch|push AGENT
// REMOTE [REF]`, with egress's exit statuses.
func (c *cli) explainGit(op string, pos []string, asJSON bool) error {
	if op != "fetch" && op != "push" {
		return usageError("--git %q: want fetch or push", op)
	}
	if len(pos) < 2 || len(pos) > 3 || (op == "push") != (len(pos) == 3) {
		return usageError(egressUsage)
	}
	agent, remote, ref := pos[0], pos[1], ""
	if len(pos) == 3 {
		ref = pos[2]
	}
	sched, err := c.scheduler()
	if err != nil {
		return err
	}
	v, err := sched.ExplainGit(context.Background(), agent, op, remote, ref)
	if err != nil {
		switch bus.ErrorName(err) {
		case bus.ErrInvalidArgument, bus.ErrNotFound:
			return &exitErr{ExitUsage, fmt.Sprintf("cannot explain git %s of %s for %s: %v", op, remote, agent, err)}
		}
		return fmt.Errorf("cannot ask the scheduler about the egress of %s: %w", agent, err)
	}
	if asJSON {
		if err := writeJSON(c.out, v); err != nil {
			return err
		}
	} else {
		explainEgress(c.out, v)
	}
	if !v.Allowed {
		return &exitErr{ExitFailed, fmt.Sprintf("git %s of %s would be refused for %s", op, remote, agent)}
	}
	return nil
}
