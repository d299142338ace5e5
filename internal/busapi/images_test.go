package busapi

import (
	"context"
	"errors"
	"testing"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/testkit/testbus"
)

// The trace context of an image call crosses in its options, and an empty
// one sends no key: a berth-imaged that refuses unknown keys still builds
// for a caller that traces nothing.
func TestImageCallsCarryTheTraceContextInTheirOptions(t *testing.T) {
	t.Parallel()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if got, err := EnsureOptionsFromWire(EnsureOptions{Traceparent: tp}.Wire()); err != nil || got.Traceparent != tp {
		t.Errorf("EnsureOptions after the wire = %+v (%v)", got, err)
	}
	if m := (EnsureOptions{}).Wire(); len(m) != 0 {
		t.Errorf("EnsureOptions without a trace send %v", m)
	}
	for _, bad := range []map[string]dbus.Variant{{"colour": dbus.MakeVariant("red")}, {"traceparent": dbus.MakeVariant(1)}} {
		if _, err := EnsureOptionsFromWire(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("EnsureOptionsFromWire(%v) = %v, want ErrInvalid", bad, err)
		}
	}
	bt := BuildTarget{Target: "ops", NoCache: true, Traceparent: tp}
	if got, err := BuildTargetFromWire(bt.Wire()); err != nil || got != bt {
		t.Errorf("BuildTarget after the wire = %+v (%v), want %+v", got, err, bt)
	}
	if _, ok := (BuildTarget{Target: "ops"}).Wire()["traceparent"]; ok {
		t.Error("a BuildTarget without a trace sends a traceparent key")
	}
}

// oldImaged is a berth-imaged from before EnsureIsolationImageWith.
type oldImaged struct{}

func (oldImaged) EnsureIsolationImage(agent string) (string, *dbus.Error) {
	return "berth-isolated:old-" + agent, nil
}

// newImaged answers both, and says which traceparent it got.
type newImaged struct{ oldImaged }

func (newImaged) EnsureIsolationImageWith(agent string, options map[string]dbus.Variant) (string, *dbus.Error) {
	opts, err := EnsureOptionsFromWire(options)
	if err != nil {
		return "", dbus.MakeFailedError(err)
	}
	return "berth-isolated:new-" + agent + "@" + opts.Traceparent, nil
}

// During an upgrade the scheduler may be newer than the berth-imaged still
// running: the call with options falls back to the one without, and the
// run gets its image (without the trace).
func TestEnsureWithOptionsFallsBackToTheOneArgumentMethodOfAnOlderImaged(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		served any
		want   string
	}{
		{"A_current_imaged_gets_the_options", newImaged{}, "berth-isolated:new-ops@00-tp"},
		{"An_older_imaged_is_asked_without_them", oldImaged{}, "berth-isolated:old-ops"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := testbus.Start(t, testbus.Options{})
			server := b.Conn(t)
			if err := server.Export(tc.served, bus.ImagesPath, bus.ImagesInterface); err != nil {
				t.Fatal(err)
			}
			if reply, err := server.RequestName(bus.ImagesName, dbus.NameFlagDoNotQueue); err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
				t.Fatalf("cannot own %s: %v (%v)", bus.ImagesName, reply, err)
			}
			tag, err := NewImages(b.Conn(t)).EnsureIsolationImageWith(context.Background(), "ops", EnsureOptions{Traceparent: "00-tp"})
			if err != nil || tag != tc.want {
				t.Fatalf("EnsureIsolationImageWith = %q (%v), want %q", tag, err, tc.want)
			}
		})
	}
}
