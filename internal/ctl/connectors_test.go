package ctl

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/busapi"
)

func TestStatusPrintsEachConnector(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		list []busapi.ConnectorStatus
		want []string
	}{
		{"No_connectors_says_so", nil, []string{"connectors: none configured"}},
		{"Each_connector_has_a_line_with_its_state_and_reconnects", []busapi.ConnectorStatus{
			{ID: "chat", Type: "meepachat", State: "connected", ConnectedSince: "2026-12-01T09:00:00Z", Reconnects: 3},
			{ID: "hooks", Type: "webhook", State: "http"},
		}, []string{"ID", "RECONNECTS", "chat", "meepachat", "connected", "2026-12-01T09:00:00Z", "3", "hooks", "webhook", "http"}},
		{"Last_error_is_shown_with_its_time", []busapi.ConnectorStatus{
			{ID: "sl", Type: "slack", State: "disconnected", LastError: "cannot connect", LastErrorAt: "2026-12-01T09:05:00Z", Reconnects: 4},
		}, []string{"sl: last error at 2026-12-01T09:05:00Z: cannot connect"}},
		{"Last_error_and_warning_are_shown_under_the_table", []busapi.ConnectorStatus{
			{ID: "dc", Type: "discord", State: "disconnected", LastError: "gateway closed\n4004", Warning: "MESSAGE_CONTENT intent not granted", Reconnects: 7},
		}, []string{"dc: last error: gateway closed 4004", "dc: WARNING: MESSAGE_CONTENT intent not granted"}},
		{"Progress_and_reactions_are_columns", []busapi.ConnectorStatus{
			{ID: "sl", Type: "slack", State: "connected", Progress: "edit", Reactions: "on"},
		}, []string{"PROGRESS", "REACTIONS", "edit", "on"}},
		{"Refused_reactions_are_a_warning_naming_what_to_grant", []busapi.ConnectorStatus{
			{ID: "sl", Type: "slack", State: "connected", Progress: "edit", Reactions: "refused, none added until intake restarts: the bot lacks the bot scope reactions:write"},
		}, []string{"refused\n", "sl: WARNING: reactions refused, none added until intake restarts: the bot lacks the bot scope reactions:write (grant it, or set reactions = false)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out strings.Builder
			if err := writeConnectors(&out, tc.list); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}
