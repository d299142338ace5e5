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
// chatty agent never blocks on a full pipe.
type Stdout struct {
	buf      bytes.Buffer
	overflow bool
}

// NewStdout returns an empty Stdout.
func NewStdout() *Stdout { return &Stdout{} }

func (c *Stdout) Write(p []byte) (int, error) {
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
	return len(p), nil
}

// Tail keeps the last StderrTail bytes written to it.
type Tail struct {
	buf []byte
}

// NewTail returns an empty Tail.
func NewTail() *Tail { return &Tail{} }

func (t *Tail) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= StderrTail {
		t.buf = append(t.buf[:0], p[len(p)-StderrTail:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - StderrTail; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

func (t *Tail) String() string { return string(t.buf) }

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

func parseResponse(stdout *Stdout, runID string) (agentproto.Response, error) {
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
