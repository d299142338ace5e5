package isolation

// What berth-agent gives back, for every backend alike: its stdout (one
// response, capped), the tail of its stderr (its logs), and the mapping of
// its exit to a Result or a RunError.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/berth-dev/berth/internal/agentproto"
)

const (
	// MaxResponse caps what is read from the agent's stdout.
	MaxResponse = 16 << 20
	// StderrTail is how much of the agent's stderr is kept in Result.Stderr.
	StderrTail = 64 << 10
	// detailTail is how much of the stderr tail goes into a RunError's Detail.
	detailTail = 2 << 10
)

// Stdout keeps the first MaxResponse bytes and discards the rest, so a
// chatty agent never blocks on a full pipe. It notices when it holds one
// whole response line (Complete), so a run can be answered before its
// sandbox has been seen to exit. It is written by the backend's copier and
// read by the supervisor at the same time.
type Stdout struct {
	mu       sync.Mutex
	buf      bytes.Buffer
	overflow bool
	complete chan struct{}
	lined    bool // the first newline was written
}

// NewStdout returns an empty Stdout.
func NewStdout() *Stdout { return &Stdout{complete: make(chan struct{})} }

func (c *Stdout) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := MaxResponse - c.buf.Len(); room > 0 {
		if len(p) > room {
			c.buf.Write(p[:room])
			c.overflow = true
		} else {
			c.buf.Write(p)
		}
	} else if len(p) > 0 {
		c.overflow = true
	}
	// berth-agent writes its response as one line of JSON (which holds no
	// raw newline), so only the stream's first newline can end it, and it is
	// looked at once: an agent writing line after line costs no rescans.
	// Whether the line is JSON at all is for Response to say: it parses it
	// anyway.
	// No earlier write held a newline, so the line is whole exactly when
	// this write's first newline is its last byte.
	if !c.lined {
		if i := bytes.IndexByte(p, '\n'); i >= 0 {
			c.lined = true
			if !c.overflow && i == len(p)-1 && c.complete != nil {
				close(c.complete)
			}
		}
	}
	return len(p), nil
}

// Complete is closed once what was written is one line, ended by its
// newline and followed by nothing: berth-agent's response, whole, before
// the agent has exited. Whether it is a valid response of the run is for
// Response to say.
func (c *Stdout) Complete() <-chan struct{} {
	if c.complete == nil { // a Stdout not made by NewStdout never completes early
		return nil
	}
	return c.complete
}

// Response parses what was written so far as the response of run runID.
func (c *Stdout) Response(runID string) (agentproto.Response, error) {
	return parseResponse(c, runID)
}

// ResponseFollows is the message of berth-agent's last log line, written
// to stderr right before its response goes to stdout. The two streams reach
// berth apart (a container's are copied separately by the engine), so a
// response complete on stdout says nothing about stderr; this line says
// the agent's log is complete too, and a run may be answered before its
// sandbox is seen to exit. An agent that does not write it is answered at
// its exit, as before.
const ResponseFollows = agentproto.LogResponseFollows

// responseFollows is how ResponseFollows appears in the agent's JSON log line.
var responseFollows = []byte(`"msg":"` + ResponseFollows + `"`)

// Tail keeps the last StderrTail bytes written to it, and notices the
// agent's ResponseFollows line (Ended). It is written by the backend's
// copier and read by the supervisor at the same time.
type Tail struct {
	mu    sync.Mutex
	buf   []byte
	ended chan struct{}
}

// NewTail returns an empty Tail.
func NewTail() *Tail { return &Tail{ended: make(chan struct{})} }

func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= StderrTail {
		t.buf = append(t.buf[:0], p[len(p)-StderrTail:]...)
	} else {
		if over := len(t.buf) + len(p) - StderrTail; over > 0 {
			t.buf = append(t.buf[:0], t.buf[over:]...)
		}
		t.buf = append(t.buf, p...)
	}
	// What this write added is looked at, and as much before it as a line
	// split across writes needs: every byte is scanned about once.
	if t.ended != nil && !isClosed(t.ended) {
		from := max(0, len(t.buf)-n-len(responseFollows)+1)
		if bytes.Contains(t.buf[from:], responseFollows) {
			close(t.ended)
		}
	}
	return n, nil
}

// Ended is closed once the agent's ResponseFollows line was written: its
// log is complete.
func (t *Tail) Ended() <-chan struct{} { return t.ended }

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// WithTail appends the end of the agent's stderr to a failure's detail.
func WithTail(detail, stderr string) string {
	tail := strings.TrimSpace(stderr)
	if tail == "" {
		return detail
	}
	if len(tail) > detailTail {
		tail = "…" + tail[len(tail)-detailTail:]
	}
	return detail + "; stderr: " + tail
}

// Interpret maps the exit code (≥ 0) and stdout of a finished agent to a
// Result or a RunError.
func Interpret(res Result, stdout *Stdout, runID string) (Result, error) {
	code := res.ExitCode
	switch code {
	case agentproto.ExitConfinement:
		return res, Errorf(ReasonConfinement, "%s", WithTail("exit code 3", res.Stderr))
	case agentproto.ExitBadRequest:
		return res, Errorf(ReasonCrashed, "%s", WithTail("exit code 2 (agent rejected the request)", res.Stderr))
	}
	resp, perr := parseResponse(stdout, runID)
	if perr == nil {
		res.Response = resp
		return res, nil
	}
	if code == agentproto.ExitOK || code == agentproto.ExitAgentError {
		return res, &RunError{Reason: ReasonBadResponse, Detail: WithTail(fmt.Sprintf("exit code %d", code), res.Stderr), Err: perr}
	}
	detail := fmt.Sprintf("exit code %d", code)
	if code > 128 {
		detail = fmt.Sprintf("exit code %d (killed by signal %d)", code, code-128)
	}
	return res, Errorf(ReasonCrashed, "%s", WithTail(detail, res.Stderr))
}

// answered is the Result of a run whose agent has written its whole
// response and not yet been seen to exit, when that response can stand for
// the run's end: it is this run's, and no tool died of SIGKILL (which would
// make the OOM check wait for the engine). The exit code is the one
// berth-agent exits with after such a response.
func answered(spec Spec, stdout *Stdout, stderr *Tail) (Result, bool) {
	resp, err := stdout.Response(spec.RunID)
	if err != nil {
		return Result{}, false
	}
	res := Result{Response: resp, ExitCode: agentproto.ExitOK, Stderr: stderr.String()}
	if resp.Error != "" {
		res.ExitCode = agentproto.ExitAgentError
	}
	if sigkilled(Exit{}, res) || resp.OOMKills > 0 {
		return Result{}, false
	}
	return res, true
}

func parseResponse(stdout *Stdout, runID string) (agentproto.Response, error) {
	stdout.mu.Lock()
	defer stdout.mu.Unlock()
	if stdout.overflow {
		return agentproto.Response{}, fmt.Errorf("response is larger than %d bytes", MaxResponse)
	}
	data := stdout.buf.Bytes()
	if len(bytes.TrimSpace(data)) == 0 {
		return agentproto.Response{}, errors.New("no response on stdout")
	}
	var resp agentproto.Response
	if err := json.Unmarshal(data, &resp); err != nil {
		return agentproto.Response{}, fmt.Errorf("cannot decode response: %w", err)
	}
	if resp.Version != agentproto.Version {
		return agentproto.Response{}, fmt.Errorf("response has version %d, want %d", resp.Version, agentproto.Version)
	}
	if resp.RunID != runID {
		return agentproto.Response{}, fmt.Errorf("response is for run %q, want %q", resp.RunID, runID)
	}
	return resp, nil
}
