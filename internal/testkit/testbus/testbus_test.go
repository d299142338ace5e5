package testbus

import (
	"os"
	"strings"
	"testing"

	"github.com/godbus/dbus/v5"
)

func TestPrivateBusEnforcesBerthPolicy(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Fatal("this test needs root: it acts as root and as user nobody")
	}
	b := Start(t, Options{})

	owner := b.Conn(t)
	reply, err := owner.RequestName("dev.berth.Scheduler1", dbus.NameFlagDoNotQueue)
	if err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("root must be able to own dev.berth.Scheduler1: reply %v, err %v", reply, err)
	}

	tests := []struct {
		name       string
		args       []string
		wantDenied bool
	}{
		{"Unprivileged_user_is_refused_Submit",
			[]string{"call", "dev.berth.Scheduler1", "/dev/berth/Scheduler1", "dev.berth.Scheduler1", "Submit", "a{ss}", "0"}, true},
		{"Unprivileged_user_is_refused_CancelRun",
			[]string{"call", "dev.berth.Scheduler1", "/dev/berth/Scheduler1", "dev.berth.Scheduler1", "CancelRun", "s", "x"}, true},
		{"Unprivileged_user_may_read_properties",
			[]string{"call", "dev.berth.Scheduler1", "/dev/berth/Scheduler1", "org.freedesktop.DBus.Properties", "GetAll", "s", "dev.berth.Scheduler1"}, false},
		{"Unprivileged_user_may_not_own_the_name",
			[]string{"call", "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "RequestName", "su", "dev.berth.Scheduler1", "4"}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := b.BusctlAs(t, "nobody", tc.args...)
			denied := strings.Contains(out, "Access denied") || strings.Contains(out, "not allowed")
			if denied != tc.wantDenied {
				t.Fatalf("denied = %v, want %v; busctl said: %s", denied, tc.wantDenied, out)
			}
		})
	}
}
