package connector_test

import (
	"errors"
	"testing"
	"time"

	"github.com/berth-dev/berth/services/intake/connector"
)

func TestStatusKeeper(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	clock := func() time.Time { return at }

	t.Run("Attempts_after_the_first_count_as_reconnects_even_when_none_succeeded", func(t *testing.T) {
		t.Parallel()
		k := connector.NewStatusKeeper("slack", connector.StateConnecting, clock)
		for range 5 {
			k.Connecting()
			k.Disconnected(errors.New("cannot connect"), at)
		}
		st := k.Snapshot()
		if st.Reconnects != 4 || st.State != connector.StateDisconnected || st.LastError != "cannot connect" || !st.LastErrorAt.Equal(at) {
			t.Fatalf("status = %+v, want 4 reconnects, disconnected, the error and its time", st)
		}
	})
	t.Run("Connecting_clears_nothing_and_connected_clears_the_error", func(t *testing.T) {
		t.Parallel()
		k := connector.NewStatusKeeper("x", connector.StateConnecting, clock)
		k.Connecting()
		k.Disconnected(errors.New("reset"), at)
		k.Connecting()
		if st := k.Snapshot(); st.LastError != "reset" || st.State != connector.StateConnecting {
			t.Fatalf("status while reconnecting = %+v, want the last error kept", st)
		}
		k.Connected(at)
		if st := k.Snapshot(); st.LastError != "" || !st.LastErrorAt.IsZero() || !st.ConnectedSince.Equal(at) || st.Reconnects != 1 {
			t.Fatalf("status once connected = %+v, want no error, connected since %s, 1 reconnect", st, at)
		}
	})
	t.Run("A_request_error_is_shown_with_its_time_until_a_later_request_succeeds", func(t *testing.T) {
		t.Parallel()
		k := connector.NewStatusKeeper("webhook", connector.StateHTTP, clock)
		k.Failed(errors.New("HTTP 503"))
		if st := k.Snapshot(); st.LastError != "HTTP 503" || !st.LastErrorAt.Equal(at) || st.State != connector.StateHTTP {
			t.Fatalf("status after a failed request = %+v", st)
		}
		k.Healthy()
		if st := k.Snapshot(); st.LastError != "" || !st.LastErrorAt.IsZero() {
			t.Fatalf("status after a later success = %+v, want the error cleared", st)
		}
	})
	t.Run("A_request_success_keeps_the_reason_the_connection_is_down", func(t *testing.T) {
		t.Parallel()
		k := connector.NewStatusKeeper("x", connector.StateConnecting, clock)
		k.Connecting()
		k.Disconnected(errors.New("gateway closed 4004"), at)
		k.Healthy()
		if st := k.Snapshot(); st.LastError != "gateway closed 4004" {
			t.Fatalf("status = %+v, want the disconnect reason kept", st)
		}
	})
	t.Run("Watch_wakes_on_the_next_change", func(t *testing.T) {
		t.Parallel()
		k := connector.NewStatusKeeper("x", connector.StateConnecting, clock)
		_, changed := k.Watch()
		k.Saw(at)
		<-changed
		if st := k.Snapshot(); !st.LastEvent.Equal(at) {
			t.Fatalf("last event = %s, want %s", st.LastEvent, at)
		}
	})
	t.Run("ClearWarning_removes_only_a_warning_with_the_prefix", func(t *testing.T) {
		t.Parallel()
		k := connector.NewStatusKeeper("x", connector.StateConnecting, clock)
		k.Warn("Slack refused app_token")
		k.ClearWarning("Slack refused bot_token")
		if st := k.Snapshot(); st.Warning == "" {
			t.Fatal("warning cleared by another prefix")
		}
		k.ClearWarning("Slack refused app_token")
		if st := k.Snapshot(); st.Warning != "" {
			t.Fatalf("warning = %q, want it cleared", st.Warning)
		}
	})
}
