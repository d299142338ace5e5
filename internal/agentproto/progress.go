package agentproto

// Progress (docs/adr/0027-live-progress.md): while it works, berth-agent
// reports what it is doing, one event per tool call it starts, as a log
// line on stderr whose message is LogProgress and whose "progress"
// attribute is a Progress. Stdout carries only the response, so progress
// can never mix with it; stderr is already the agent's log, read by every
// backend. The agent writes at most MaxProgressEvents a run and no Text
// longer than MaxProgressText bytes; the supervisor holds it to the same
// caps, and to MaxProgressLine per line, whatever an agent writes.

// LogProgress is the message of a progress log line.
const LogProgress = "progress"

// Progress caps.
const (
	// MaxProgressText is the longest Text, in bytes.
	MaxProgressText = 160
	// MaxProgressEvents is how many progress events one run reports.
	MaxProgressEvents = 256
	// MaxProgressLine is the longest log line read as a progress event;
	// longer lines stay in the log and are not parsed.
	MaxProgressLine = 4 << 10
)

// Progress is one progress event: a tool call the agent started.
type Progress struct {
	// Seq numbers a run's events from 1, in the order they happened.
	Seq int `json:"seq"`
	// Tool is the tool's name.
	Tool string `json:"tool"`
	// Text is a short summary a chat user may see ("running `pytest`",
	// "fetching pypi.org"): never the tool's arguments whole.
	Text string `json:"text"`
}
