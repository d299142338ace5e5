package discordtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"unicode/utf8"
)

// Message components as discord-api-docs documents them
// (interactions/message-components.mdx): a message takes at most 5 action
// rows (type 1), a row at most 5 buttons (type 2); a button with a style
// 1–4 needs a custom_id of 1–100 characters, unique in the message, style
// 5 (link) a url and no custom_id; a label has at most 80 characters. The
// fake answers anything else 400 Invalid Form Body (code 50035), as
// Discord does.

// Row is one action row of a posted message.
type Row struct {
	Type    int      `json:"type"`
	Buttons []Button `json:"components"`
}

// Button is one button of a posted message.
type Button struct {
	Type     int    `json:"type"`
	Style    int    `json:"style"`
	Label    string `json:"label"`
	CustomID string `json:"custom_id,omitempty"`
	URL      string `json:"url,omitempty"`
}

// Buttons lists the post's buttons, row after row.
func (p Post) Buttons() []Button {
	var out []Button
	for _, r := range p.Components {
		out = append(out, r.Buttons...)
	}
	return out
}

// checkComponents is why rows are not what Discord takes; "" when they are.
func checkComponents(rows []Row) string {
	if len(rows) > 5 {
		return "components: must be 5 or fewer in length"
	}
	ids := map[string]bool{}
	for i, r := range rows {
		if r.Type != 1 {
			return fmt.Sprintf("components[%d]: a top-level component must be an action row (type 1)", i)
		}
		if len(r.Buttons) == 0 || len(r.Buttons) > 5 {
			return fmt.Sprintf("components[%d].components: must be between 1 and 5 in length", i)
		}
		for j, b := range r.Buttons {
			at := fmt.Sprintf("components[%d].components[%d]", i, j)
			switch {
			case b.Type != 2:
				return at + ": only buttons are taken in this fake"
			case b.Style < 1 || b.Style > 5:
				return at + ".style: not a button style"
			case b.Style == 5 && (b.URL == "" || b.CustomID != ""):
				return at + ": a link button has a url and no custom_id"
			case b.Style != 5 && (b.CustomID == "" || len(b.CustomID) > 100):
				return at + ".custom_id: must be between 1 and 100 in length"
			case utf8.RuneCountInString(b.Label) > 80:
				return at + ".label: must be 80 or fewer in length"
			case b.CustomID != "" && ids[b.CustomID]:
				return at + ".custom_id: component custom id cannot be duplicated"
			}
			ids[b.CustomID] = true
		}
	}
	return ""
}

// readComponents decodes and checks a message's components; false when it
// answered 400.
func readComponents(w http.ResponseWriter, raw json.RawMessage) ([]Row, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, true
	}
	var rows []Row
	why := ""
	if err := json.Unmarshal(raw, &rows); err != nil {
		why = "components: " + err.Error()
	} else {
		why = checkComponents(rows)
	}
	if why != "" {
		reply(w, http.StatusBadRequest, map[string]any{"message": "Invalid Form Body", "code": 50035,
			"errors": map[string]any{"components": map[string]any{"_errors": []any{map[string]any{"code": "COMPONENT_INVALID", "message": why}}}}})
		return nil, false
	}
	return rows, true
}
