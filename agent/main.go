package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"unicode/utf8"

	"github.com/berth-dev/berth/agent/confine"
	agentegress "github.com/berth-dev/berth/agent/egress"
	"github.com/berth-dev/berth/agent/tools"
	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/hostsandbox"
)

// MaxRequestSize is the largest request read from stdin.
const MaxRequestSize = 16 << 20

// DefaultMaxIterations applies when the request leaves max_iterations at 0.
const DefaultMaxIterations = 20

// Main runs berth-agent with the given standard streams and returns its exit
// code (see the package documentation).
func Main(stdin io.Reader, stdout, stderr io.Writer) int {
	log := newLogger(stderr)
	// Before the request and its provider key are read: from then on no
	// process of the same uid can read or trace this one.
	if err := confine.NonDumpable(); err != nil {
		log.Error("refusing to run", "reason", err.Error())
		return agentproto.ExitConfinement
	}

	req, rest, err := readRequest(stdin)
	if err != nil {
		log.Error("bad request", "reason", err.Error())
		return agentproto.ExitBadRequest
	}
	log = log.With("run_id", req.RunID, "agent", req.Agent.ID)
	// Opened before Landlock, which would refuse the cgroup filesystem.
	oom := watchOOM(log)
	launcher, release, ok := confineFor(req, log)
	if !ok {
		return agentproto.ExitConfinement
	}
	defer release()
	// The end of stdin may come milliseconds after the request (a
	// container's stdin is closed by the engine); confining did not wait
	// for it, nothing of the request is acted on before it.
	if err := rest(); err != nil {
		log.Error("bad request", "reason", err.Error())
		return agentproto.ExitBadRequest
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	before := oom.now()
	resp, code := runSafely(ctx, req, launcher, log)
	resp.OOMKills = oom.since(before)
	// The last log line: with it and the response the supervisor may
	// answer the run before the sandbox is seen to exit.
	log.Info(agentproto.LogResponseFollows)
	if err := json.NewEncoder(stdout).Encode(deliverable(resp)); err != nil {
		log.Error("cannot write response", "err", err.Error())
		return agentproto.ExitInternal
	}
	return code
}

// confineFor confines this process as req says, in the order that matters:
// rlimits, the host's sockets masked, the egress proxy bound, then Landlock
// and the syscall filter. ok false means it refused (the reason is logged);
// release stops the egress proxy.
func confineFor(req agentproto.Request, log *slog.Logger) (launcher *confine.Launcher, release func(), ok bool) {
	release = func() {}
	// The run's rlimits hold before anything of it happens.
	if err := hostsandbox.ApplyRlimits(req.Rlimits); err != nil {
		log.Error("refusing to run: confinement failed", "reason", err.Error())
		return nil, release, false
	}
	// Before anything binds or starts: the host's sockets leave the view.
	if masked, err := confine.MaskSelf(req); err != nil {
		log.Error("refusing to run: confinement failed", "reason", err.Error())
		return nil, release, false
	} else if len(masked) > 0 {
		log.Info("masked the host's socket directories", "masked", masked)
	}

	if req.Egress != nil {
		// Bound before Landlock forbids binds; served until the run ends.
		proxy, err := serveEgress(*req.Egress, log)
		if err != nil {
			log.Error("refusing to run: no way out through the egress proxy", "reason", err.Error())
			return nil, release, false
		}
		release = func() { proxy.Close() }
	}

	if req.Policy.Unrestricted {
		log.Warn("running UNRESTRICTED: no Landlock confinement, as the admin configured")
		return nil, release, true
	}
	abi, err := confine.EffectiveABI()
	if err == nil {
		// Landlock and the syscall filter, before any tool runs.
		launcher, err = confine.Enforce(req.Policy, abi, log)
	}
	if err != nil {
		log.Error("refusing to run: confinement failed", "reason", err.Error())
		release()
		return nil, func() {}, false
	}
	return launcher, release, true
}

// serveEgress starts the in-sandbox egress proxy on the request's loopback
// address, bringing the namespace's loopback up first where it is down.
func serveEgress(e agentproto.Egress, log *slog.Logger) (*agentegress.Proxy, error) {
	if _, err := agentegress.LoopbackUp(); err != nil {
		return nil, err
	}
	// Whatever the runner granted for that (CAP_NET_ADMIN in the agent's
	// own user namespace) must not reach the tools.
	if err := agentegress.DropCapabilities(); err != nil {
		return nil, err
	}
	proxy, err := agentegress.Listen(e)
	if err != nil {
		return nil, err
	}
	go func() {
		if err := proxy.Serve(); err != nil {
			log.Error("egress proxy stopped", "err", err.Error())
		}
	}()
	return proxy, nil
}

// runSafely runs the request and turns a panic into an internal error response.
func runSafely(ctx context.Context, req agentproto.Request, launcher *confine.Launcher, log *slog.Logger) (resp agentproto.Response, code int) {
	defer func() {
		if p := recover(); p != nil {
			log.Error("panic", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			resp = agentproto.Response{Version: agentproto.Version, RunID: req.RunID,
				Reply: "The agent failed unexpectedly.", Error: fmt.Sprintf("internal error: %v", p)}
			code = agentproto.ExitInternal
		}
	}()
	return run(ctx, req, launcher, log)
}

// deliverable cleans every text of the response the scheduler passes on
// over D-Bus (reply, error, tool calls): valid UTF-8 without NUL.
func deliverable(resp agentproto.Response) agentproto.Response {
	resp.Reply, resp.Error = tools.CleanText(resp.Reply), tools.CleanText(resp.Error)
	calls := make([]agentproto.ToolCall, len(resp.ToolCalls))
	for i, c := range resp.ToolCalls {
		calls[i] = agentproto.ToolCall{Name: tools.CleanText(c.Name), Args: cleanArgs(c.Args),
			Output: tools.CleanText(c.Output), Error: tools.CleanText(c.Error), Approval: tools.CleanText(c.Approval)}
	}
	if resp.ToolCalls != nil {
		resp.ToolCalls = calls
	}
	return resp
}

// cleanArgs makes recorded tool arguments decode to clean text: JSON whose
// strings hold invalid UTF-8 or NUL (raw or as \u0000) is decoded, cleaned
// and encoded again; anything else is kept byte for byte.
func cleanArgs(args json.RawMessage) json.RawMessage {
	if len(args) == 0 || (utf8.Valid(args) && !bytes.Contains(args, []byte{0}) && !bytes.Contains(args, []byte(`\u0000`))) {
		return args
	}
	var v any
	if err := json.Unmarshal(args, &v); err != nil {
		quoted, _ := json.Marshal(tools.CleanText(string(args)))
		return quoted
	}
	out, err := json.Marshal(cleanValue(v))
	if err != nil {
		quoted, _ := json.Marshal(tools.CleanText(string(args)))
		return quoted
	}
	return out
}

func cleanValue(v any) any {
	switch v := v.(type) {
	case string:
		return tools.CleanText(v)
	case []any:
		for i := range v {
			v[i] = cleanValue(v[i])
		}
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[tools.CleanText(k)] = cleanValue(e)
		}
		return out
	}
	return v
}

func newLogger(stderr io.Writer) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(os.Getenv("BERTH_LOG_LEVEL"))); err != nil {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
}

// readRequest reads and validates one request. Unknown fields are refused: a
// misspelt policy key must not silently weaken the sandbox. It returns as
// soon as the request's JSON object is complete; rest then reads stdin to
// its end and refuses what follows the object or makes stdin too large.
func readRequest(r io.Reader) (req agentproto.Request, rest func() error, err error) {
	limited := &countingReader{r: io.LimitReader(r, MaxRequestSize+1)}
	var read bytes.Buffer
	dec := json.NewDecoder(io.TeeReader(limited, &read))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err == nil && req.Version == agentproto.Version {
		if err := validate(req); err != nil {
			return req, nil, err
		}
		read = bytes.Buffer{} // not needed any more: the object decoded
		return req, func() error {
			more := dec.More()
			if _, err := io.Copy(io.Discard, limited); err != nil {
				return fmt.Errorf("cannot read stdin: %w", err)
			}
			if limited.n > MaxRequestSize {
				return fmt.Errorf("request is larger than %d bytes", MaxRequestSize)
			}
			if more {
				return errors.New("malformed request: trailing data after the JSON object")
			}
			return nil
		}, nil
	}
	// Not a request of this version: everything is read and explained as
	// a whole.
	if _, err := io.Copy(&read, limited); err != nil {
		return req, nil, fmt.Errorf("cannot read stdin: %w", err)
	}
	req, err = decodeRequest(read.Bytes())
	return req, func() error { return nil }, err
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// decodeRequest decodes and validates one whole request, data (all of
// stdin, or one line of a sandbox's).
func decodeRequest(data []byte) (agentproto.Request, error) {
	var req agentproto.Request
	if len(data) > MaxRequestSize {
		return req, fmt.Errorf("request is larger than %d bytes", MaxRequestSize)
	}
	// The strict decode first: a request of this version decodes once.
	// Anything else is explained as before — not JSON, no version, another
	// version (whose fields this build may not know), then what is wrong.
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.Version != agentproto.Version {
		if perr := checkVersion(data); perr != nil {
			return req, perr
		}
		if err == nil {
			err = fmt.Errorf("version %d", req.Version) // unreachable: checkVersion agrees with the decoder
		}
		return req, fmt.Errorf("malformed request: %w", err)
	}
	if dec.More() {
		return req, errors.New("malformed request: trailing data after the JSON object")
	}
	return req, validate(req)
}

// checkVersion reports why data is not a request of this version: not a
// JSON object, no version, or another version; nil when it is one.
func checkVersion(data []byte) error {
	var probe struct {
		Version *int `json:"version"`
	}
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&probe); err != nil {
		return fmt.Errorf("request is not a JSON object: %w", err)
	}
	if probe.Version == nil {
		return errors.New("request has no version")
	}
	if *probe.Version != agentproto.Version {
		return fmt.Errorf("request version %d is not supported (this build speaks %d)", *probe.Version, agentproto.Version)
	}
	return nil
}

func validate(req agentproto.Request) error {
	switch {
	case req.RunID == "":
		return errors.New("request has no run_id")
	case !filepath.IsAbs(req.Workspace):
		return fmt.Errorf("workspace %q is not an absolute path", req.Workspace)
	case req.Agent.MaxIterations < 0:
		return fmt.Errorf("max_iterations %d is negative", req.Agent.MaxIterations)
	}
	for i, turn := range req.History {
		if turn.Role != "user" && turn.Role != "assistant" {
			return fmt.Errorf("history turn %d has role %q, want user or assistant", i, turn.Role)
		}
	}
	for _, list := range [][]string{req.Policy.AllowRead, req.Policy.AllowReadWrite, req.Policy.Deny} {
		for _, p := range list {
			if !filepath.IsAbs(p) {
				return fmt.Errorf("policy path %q is not absolute", p)
			}
		}
	}
	return nil
}
