package ctl

import (
	"io"
	"strings"
	"testing"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/busapi"
)

// writeConnectorsProperty is what status does with the Connectors property
// as the bus carries it.
func writeConnectorsProperty(w io.Writer, v dbus.Variant) error {
	list, err := busapi.ConnectorsFromWire(v)
	if err != nil {
		return err
	}
	return writeConnectors(w, list)
}

func TestStatusPrintsEachConnector(t *testing.T) {
	t.Parallel()
	conn := func(id, typ, state, since, lastErr, warning string, reconnects uint32) map[string]dbus.Variant {
		return map[string]dbus.Variant{
			"id": dbus.MakeVariant(id), "type": dbus.MakeVariant(typ), "state": dbus.MakeVariant(state),
			"connected_since": dbus.MakeVariant(since), "last_event": dbus.MakeVariant(""),
			"last_error": dbus.MakeVariant(lastErr), "reconnects": dbus.MakeVariant(reconnects), "warning": dbus.MakeVariant(warning),
		}
	}
	withErrorAt := func(c map[string]dbus.Variant, at string) map[string]dbus.Variant {
		c["last_error_at"] = dbus.MakeVariant(at)
		return c
	}
	tests := []struct {
		name  string
		value dbus.Variant
		want  []string
	}{
		{"No_connectors_says_so", dbus.MakeVariant([]map[string]dbus.Variant{}), []string{"connectors: none configured"}},
		{"Each_connector_has_a_line_with_its_state_and_reconnects", dbus.MakeVariant([]map[string]dbus.Variant{
			conn("chat", "meepachat", "connected", "2026-12-01T09:00:00Z", "", "", 3),
			conn("hooks", "webhook", "http", "", "", "", 0),
		}), []string{"ID", "RECONNECTS", "chat", "meepachat", "connected", "2026-12-01T09:00:00Z", "3", "hooks", "webhook", "http"}},
		{"Last_error_is_shown_with_its_time", dbus.MakeVariant([]map[string]dbus.Variant{
			withErrorAt(conn("sl", "slack", "disconnected", "", "cannot connect", "", 4), "2026-12-01T09:05:00Z"),
		}), []string{"sl: last error at 2026-12-01T09:05:00Z: cannot connect"}},
		{"Last_error_and_warning_are_shown_under_the_table", dbus.MakeVariant([]map[string]dbus.Variant{
			conn("dc", "discord", "disconnected", "", "gateway closed\n4004", "MESSAGE_CONTENT intent not granted", 7),
		}), []string{"dc: last error: gateway closed 4004", "dc: WARNING: MESSAGE_CONTENT intent not granted"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out strings.Builder
			if err := writeConnectorsProperty(&out, tc.value); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
	t.Run("A_property_of_another_type_is_an_error", func(t *testing.T) {
		t.Parallel()
		if err := writeConnectorsProperty(&strings.Builder{}, dbus.MakeVariant("x")); err == nil || !strings.Contains(err.Error(), "want aa{sv}") {
			t.Fatalf("err = %v, want one naming the expected type", err)
		}
	})
}
