package schedules

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/calendar"
)

// Job is one scheduled job as the scheduler's configuration gives it.
type Job struct {
	// ID names the job in listings, on the bus and in its timer's unit
	// name: lower-case letters, digits, - and _.
	ID string
	// OnCalendar is a systemd calendar expression, e.g. "Mon..Fri 09:00 Europe/Berlin".
	OnCalendar string
	Agent      string
	// Prompt is the message the run starts with; PromptFile instead names
	// a file in the agent's workspace that holds it (read at each firing,
	// so the agent may rewrite its own HEARTBEAT.md). Exactly one is set.
	Prompt     string
	PromptFile string
	DeliverTo  Destination
	// ActiveHours, "HH:MM-HH:MM" in the expression's zone (the host's when
	// it names none), limits scheduled firings to that part of the day; a
	// window may wrap past midnight ("22:00-06:00"). Empty: all day.
	ActiveHours string
	// Model overrides the agent's model for this job's runs; empty: the agent's.
	Model string
	// MaxRuntime bounds each run (the scheduler's run limit); 0: the agent's.
	MaxRuntime time.Duration
	// Overlap says what a firing does while the job's previous one still
	// runs: OverlapSkip (the default) or OverlapWait.
	Overlap Overlap
}

// Destination is where a fired run's reply is delivered.
type Destination struct {
	Connector string
	Channel   string
	Thread    string // optional
}

// Overlap is what a firing does while the job's previous firing still runs.
type Overlap string

const (
	// OverlapSkip drops the firing, with a journal line.
	OverlapSkip Overlap = "skip"
	// OverlapWait fires once more when the running firing ends; firings
	// that arrive meanwhile share that one.
	OverlapWait Overlap = "wait"
)

var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

// compiled is a job with what Validate read from it.
type compiled struct {
	job    Job
	spec   *calendar.Spec
	window *window
}

// Validate says what is wrong with a job, if anything.
func (j Job) Validate() error {
	_, err := compile(j)
	return err
}

func compile(j Job) (compiled, error) {
	fail := func(format string, args ...any) (compiled, error) {
		return compiled{}, fmt.Errorf("cannot use schedule %q: %s", j.ID, fmt.Sprintf(format, args...))
	}
	if !idPattern.MatchString(j.ID) {
		return fail("its id must be 1 to 64 lower-case letters, digits, - or _, starting with a letter or digit")
	}
	spec, err := calendar.Parse(j.OnCalendar)
	if err != nil {
		return fail("on_calendar: %v", err)
	}
	if j.Agent == "" {
		return fail("it names no agent")
	}
	if (j.Prompt == "") == (j.PromptFile == "") {
		return fail("it needs exactly one of prompt and prompt_file")
	}
	if j.PromptFile != "" && !filepath.IsLocal(j.PromptFile) {
		return fail("prompt_file %q must be a relative path inside the agent's workspace", j.PromptFile)
	}
	if j.DeliverTo.Connector == "" || j.DeliverTo.Channel == "" {
		return fail("deliver_to needs a connector and a channel")
	}
	if j.MaxRuntime < 0 {
		return fail("max_runtime %s is negative", j.MaxRuntime)
	}
	switch j.Overlap {
	case "", OverlapSkip, OverlapWait:
	default:
		return fail("overlap %q is neither %q nor %q", j.Overlap, OverlapSkip, OverlapWait)
	}
	c := compiled{job: j, spec: spec}
	if j.ActiveHours != "" {
		w, err := parseWindow(j.ActiveHours)
		if err != nil {
			return fail("active_hours: %v", err)
		}
		c.window = &w
	}
	if c.job.Overlap == "" {
		c.job.Overlap = OverlapSkip
	}
	return c, nil
}

// CheckID says what is wrong with a job's id, if anything; berth.toml's
// loader asks it so that the error names the file, line and key.
func CheckID(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("%q is not a schedule id: use 1 to 64 lower-case letters, digits, - or _, starting with a letter or digit", id)
	}
	return nil
}

// CheckActiveHours says what is wrong with an active_hours window, if anything.
func CheckActiveHours(s string) error {
	_, err := parseWindow(s)
	return err
}

// window is a part of the day, in minutes since midnight; from > to wraps
// past midnight.
type window struct{ from, to int }

func parseWindow(s string) (window, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return window{}, fmt.Errorf("%q is not written HH:MM-HH:MM", s)
	}
	from, err := minuteOfDay(a)
	if err != nil {
		return window{}, err
	}
	to, err := minuteOfDay(b)
	if err != nil {
		return window{}, err
	}
	if from == to {
		return window{}, fmt.Errorf("%q is empty: it starts where it ends", s)
	}
	return window{from, to}, nil
}

func minuteOfDay(s string) (int, error) {
	if s == "24:00" {
		return 24 * 60, nil
	}
	t, err := time.Parse("15:04", strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not a time of day HH:MM", s)
	}
	return t.Hour()*60 + t.Minute(), nil
}

// contains says whether the wall time of t lies in the window.
func (w window) contains(t time.Time) bool {
	m := t.Hour()*60 + t.Minute()
	if w.from < w.to {
		return m >= w.from && m < w.to
	}
	return m >= w.from || m < w.to
}

// maxPromptFile bounds a prompt read from a workspace: it becomes a model
// message, and a workspace file is the agent's to grow.
const maxPromptFile = 64 << 10

// ReadPrompt is the job's prompt: Prompt, or PromptFile read from the
// workspace directory. The file is opened inside the workspace (os.Root),
// so neither .. nor a symbolic link leads the scheduler out of it.
func (j Job) ReadPrompt(workspace string) (string, error) {
	if j.PromptFile == "" {
		return j.Prompt, nil
	}
	root, err := os.OpenRoot(workspace)
	if err != nil {
		return "", fmt.Errorf("cannot read the prompt of schedule %q: %w", j.ID, err)
	}
	defer root.Close()
	f, err := root.Open(j.PromptFile)
	if err != nil {
		return "", fmt.Errorf("cannot read the prompt of schedule %q: %w", j.ID, err)
	}
	defer f.Close()
	if info, err := f.Stat(); err != nil || !info.Mode().IsRegular() {
		return "", fmt.Errorf("cannot read the prompt of schedule %q: %s is not a regular file", j.ID, j.PromptFile)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxPromptFile+1))
	if err != nil {
		return "", fmt.Errorf("cannot read the prompt of schedule %q: %w", j.ID, err)
	}
	if len(b) > maxPromptFile {
		return "", fmt.Errorf("cannot read the prompt of schedule %q: %s is larger than %d KiB", j.ID, j.PromptFile, maxPromptFile>>10)
	}
	if strings.TrimSpace(string(b)) == "" {
		return "", fmt.Errorf("cannot read the prompt of schedule %q: %s is empty", j.ID, j.PromptFile)
	}
	return string(b), nil
}

// HeartbeatOK is the reply by which an agent checks in quietly (OpenClaw's
// convention).
const HeartbeatOK = "HEARTBEAT_OK"

// Quiet says whether a fired run's reply is the heartbeat acknowledgement,
// which the delivery path drops instead of posting. Only the whole reply
// counts (surrounding white space aside): a reply that says anything more
// is delivered.
func Quiet(reply string) bool {
	return strings.TrimSpace(reply) == HeartbeatOK
}

// ErrUnknown is returned for an id no job has.
var ErrUnknown = errors.New("there is no such schedule")
