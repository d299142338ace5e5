package config

// [[connectors]] progress and reactions (docs/adr/0027-live-progress.md):
// how a chat platform shows a run in progress.

// Progress values.
const (
	// ProgressEdit posts one progress message at the first tool call,
	// edits it in place as the agent calls tools, and deletes it once the
	// answer is posted. Discord and Slack; MeepaChat's API has no edit.
	ProgressEdit = "edit"
	// ProgressTyping shows the platform's typing indicator (MeepaChat,
	// Discord); on Slack, which has none for bots, it shows nothing.
	ProgressTyping = "typing"
	// ProgressOff shows nothing until the answer.
	ProgressOff = "off"
)

// DefaultProgress is a connector type's progress when none is set:
// "typing" where the platform has a typing indicator, else "off". A
// webhook has neither: its Progress stays "".
func DefaultProgress(connectorType string) string {
	switch connectorType {
	case ConnectorMeepaChat, ConnectorDiscord:
		return ProgressTyping
	}
	return ProgressOff
}
