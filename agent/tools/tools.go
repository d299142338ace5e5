// Package tools holds the tools a berth agent can call — shell, read_file,
// write_file, list_dir, web_fetch, memory_store, memory_search,
// memory_delete, memory_note, memory_read, soul_read, soul_edit, send_file, and
// web_search and the MCP servers' mcp__<server>__<tool> when the request
// has them — and the allow/deny filter over them. A tool never
// crashes the run: bad arguments and failures come back as errors for the
// model to read. The sandbox, not this package, decides what a tool may
// touch; the package only keeps relative paths inside the workspace.
package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/berth-dev/berth/agent/provider"
)

// Tool is one callable tool.
type Tool interface {
	Spec() provider.Tool
	// Call runs the tool. The error is shown to the model.
	Call(ctx context.Context, args json.RawMessage) (string, error)
}

// Env is what the tools run against.
type Env struct {
	// Workspace is the absolute workspace path; relative paths resolve in it
	// and the shell starts in it.
	Workspace string
	// TmpDir is TMPDIR for shell commands.
	TmpDir string
	// Network says whether the agent may use the network (web_fetch
	// refuses at once without it instead of timing out in an empty
	// network namespace).
	Network bool
	// ProxyEnv is what shell commands get in their environment to use the
	// run's egress proxy (HTTP_PROXY and friends); ProxyURL is the proxy
	// web_fetch goes through and CABundle the roots it trusts then, when
	// set. All empty for a run with a direct network.
	ProxyEnv []string
	ProxyURL string
	CABundle string
	// Own, when set, puts berth-agent's own requests (web_search,
	// berth.toml's MCP servers) on its own channel at the egress proxy
	// (agent/egress.OwnChannel), which no tool can use.
	Own func(base *http.Transport) http.RoundTripper
	// Outbox, when set, gathers the files send_file attaches to the reply;
	// without it send_file refuses.
	Outbox *Outbox
	// Processes, when set, starts and signals every process a tool runs:
	// berth-agent's confine.Launcher puts them in the tools' stricter
	// Landlock domain. Unset, they start as they are.
	Processes Processes
}

// Processes starts tool processes and signals them (pid < 0: a process group).
type Processes interface {
	Start(cmd *exec.Cmd) error
	Kill(pid int, sig syscall.Signal) error
}

type plainProcesses struct{}

func (plainProcesses) Start(cmd *exec.Cmd) error              { return cmd.Start() }
func (plainProcesses) Kill(pid int, sig syscall.Signal) error { return syscall.Kill(pid, sig) }

func (e Env) processes() Processes {
	if e.Processes == nil {
		return plainProcesses{}
	}
	return e.Processes
}

// Builtin returns every tool of this build, in a stable order.
func Builtin(env Env) []Tool {
	return []Tool{
		shell{env}, readFile{env}, writeFile{env}, listDir{env}, webFetch{env},
		memoryStore{env}, memorySearch{env}, memoryDelete{env}, memoryNote{env}, memoryRead{env},
		soulRead{env}, soulEdit{env}, sendFile{env},
	}
}

// Set is the tools one agent may call.
type Set struct {
	tools []Tool
	asks  toolAsks // Asking
}

// Filter keeps the tools allow names (all of them when allow is empty),
// minus the ones deny names. Deny wins.
func Filter(all []Tool, allow, deny []string) *Set {
	s := &Set{}
	for _, t := range all {
		name := t.Spec().Name
		if len(allow) > 0 && !slices.Contains(allow, name) {
			continue
		}
		if slices.Contains(deny, name) {
			continue
		}
		s.tools = append(s.tools, t)
	}
	return s
}

// Restrict keeps only the named tools of the set (a skill's tools list).
func (s *Set) Restrict(names []string) *Set {
	out := &Set{asks: s.asks}
	for _, t := range s.tools {
		if slices.Contains(names, t.Spec().Name) {
			out.tools = append(out.tools, t)
		}
	}
	return out
}

// Specs describes the tools in the set, for the provider.
func (s *Set) Specs() []provider.Tool {
	specs := make([]provider.Tool, 0, len(s.tools))
	for _, t := range s.tools {
		specs = append(specs, t.Spec())
	}
	return specs
}

// Call runs the named tool; a tool outside the set is an error for the
// model. The caller asks first (Ask).
func (s *Set) Call(ctx context.Context, name string, args json.RawMessage) (string, error) {
	i := slices.IndexFunc(s.tools, func(t Tool) bool { return t.Spec().Name == name })
	if i < 0 {
		return "", fmt.Errorf("tool %q is not available to this agent", name)
	}
	return s.tools[i].Call(ctx, args)
}

// decodeArgs reads a tool's JSON arguments strictly: unknown fields and wrong
// types are errors the model can correct.
func decodeArgs(raw json.RawMessage, v any) error {
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = json.RawMessage("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("bad arguments: %w", err)
	}
	if dec.More() {
		return errors.New("bad arguments: trailing data after the JSON object")
	}
	return nil
}

// resolve turns a tool's path argument into an absolute path with symlinks
// resolved (as far as it exists). A relative path must stay inside the
// workspace; an absolute path is left for the sandbox to judge.
func (e Env) resolve(path string) (string, error) {
	if path == "" {
		return "", errors.New("bad arguments: path is empty")
	}
	if filepath.IsAbs(path) {
		full, err := resolveExisting(filepath.Clean(path))
		if err != nil {
			return "", err
		}
		return refuseOwnProc(full)
	}
	ws, err := resolveExisting(e.Workspace)
	if err != nil {
		return "", err
	}
	full, err := resolveExisting(filepath.Join(ws, path))
	if err != nil {
		return "", err
	}
	if full != ws && !strings.HasPrefix(full, ws+string(filepath.Separator)) {
		return "", fmt.Errorf("relative path %q leads outside the workspace; use an absolute path", path)
	}
	return refuseOwnProc(full)
}

// refuseOwnProc refuses berth-agent's own /proc entry (where /proc/self
// leads): in-process tools run with the agent's rights, which include it,
// and nothing a tool needs is in there.
func refuseOwnProc(path string) (string, error) {
	own := fmt.Sprintf("/proc/%d", os.Getpid())
	if path == own || strings.HasPrefix(path, own+"/") {
		return "", fmt.Errorf("%s is berth-agent's own /proc entry: tools may not use it", path)
	}
	return path, nil
}

// resolveExisting resolves symlinks in the longest existing prefix of path
// and appends the rest unchanged.
func resolveExisting(path string) (string, error) {
	rest := ""
	for {
		resolved, err := filepath.EvalSymlinks(path)
		if err == nil {
			return filepath.Join(resolved, rest), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("cannot resolve %s: %w", path, err)
		}
		parent := filepath.Dir(path)
		if parent == path {
			return filepath.Join(path, rest), nil
		}
		rest = filepath.Join(filepath.Base(path), rest)
		path = parent
	}
}

// capped keeps the first limit bytes written to it and counts the rest.
type capped struct {
	buf     bytes.Buffer
	limit   int
	dropped int64
}

func (c *capped) Write(p []byte) (int, error) {
	room := c.limit - c.buf.Len()
	if room >= len(p) {
		c.buf.Write(p)
		return len(p), nil
	}
	if room > 0 {
		c.buf.Write(p[:room])
	}
	c.dropped += int64(len(p) - max(room, 0))
	return len(p), nil
}

// String is the kept output with a marker when some was dropped.
func (c *capped) String() string {
	if c.dropped == 0 {
		return c.buf.String()
	}
	return fmt.Sprintf("%s\n[... %d more bytes truncated]", c.buf.String(), c.dropped)
}

func schema(s string) json.RawMessage { return json.RawMessage(s) }
