package discord

import (
	"strings"
	"unicode/utf8"

	"github.com/berth-dev/berth/services/intake/connector"
)

// Approvals asked in the chat (connector/approvals.go, issue 26): a reply
// with a Question carries one button per choice (message components,
// interactions/message-components.mdx); a click comes back as a
// MESSAGE_COMPONENT interaction (clicks.go). Deciding is the scheduler's:
// this package only shows the choices and says who clicked what.

// Discord's limits on components (message-components.mdx).
const (
	maxButtonsPerRow = 5
	maxRows          = 5
	maxCustomID      = 100
	maxButtonLabel   = 80
)

// Component types and button styles.
const (
	componentActionRow = 1
	componentButton    = 2

	stylePrimary = 1
	styleSuccess = 3
	styleDanger  = 4
)

// button is a button as Discord's API takes it.
type button struct {
	Type     int    `json:"type"`
	Style    int    `json:"style"`
	Label    string `json:"label"`
	CustomID string `json:"custom_id"`
}

// actionRow holds up to five buttons.
type actionRow struct {
	Type       int      `json:"type"`
	Components []button `json:"components"`
}

// questionComponents are q's buttons, in the order of its choices, in rows
// of five. A choice that is no decision, comes again, or whose custom_id
// would pass Discord's 100 characters gets no button (q's text names the
// keywords): Discord refuses the whole message for one bad button.
func (c *Connector) questionComponents(q *connector.Question) []actionRow {
	if q == nil {
		return nil
	}
	var rows []actionRow
	seen := map[string]bool{}
	for _, choice := range q.Choices {
		style, ok := choiceStyle(choice)
		id := connector.ChoiceValue(q.ID, choice)
		if _, parses := connector.ParseChoice(id); !ok || !parses || len(id) > maxCustomID || seen[id] {
			c.log.Warn("discord question: a choice gets no button", "approval_id", q.ID, "choice", choice)
			continue
		}
		seen[id] = true
		if len(rows) == 0 || len(rows[len(rows)-1].Components) == maxButtonsPerRow {
			if len(rows) == maxRows {
				break
			}
			rows = append(rows, actionRow{Type: componentActionRow})
		}
		last := &rows[len(rows)-1]
		last.Components = append(last.Components, button{Type: componentButton, Style: style, Label: cutLabel(connector.ChoiceLabel(choice)), CustomID: id})
	}
	return rows
}

func choiceStyle(decision string) (int, bool) {
	switch decision {
	case connector.DecideAllowOnce:
		return styleSuccess, true
	case connector.DecideAllowConversation:
		return stylePrimary, true
	case connector.DecideDeny:
		return styleDanger, true
	}
	return 0, false
}

// cutLabel keeps a label within maxButtonLabel characters.
func cutLabel(s string) string {
	if utf8.RuneCountInString(s) <= maxButtonLabel {
		return s
	}
	return strings.TrimSpace(string([]rune(s)[:maxButtonLabel-1])) + "…"
}
