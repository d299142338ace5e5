package images_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/services/images"
)

func TestUnprivilegedCallerIsRefusedBuildRemoveAndClean(t *testing.T) {
	t.Parallel()
	needBusybox(t)
	cfg, _ := writeConfig(t, "[[agents]]\nid = \"ops\"\n[agents.container_mode]\nenabled = true\n")
	f := newService(t, cfg)
	tag := ensure(t, f, "ops")
	calls := []struct {
		name string
		args []string
	}{
		{"Build", []string{"Build", "a{sv}", "1", "target", "s", "ops"}},
		{"Remove", []string{"Remove", "s", tag}},
		{"Clean", []string{"Clean", "b", "true"}},
		{"EnsureIsolationImage", []string{"EnsureIsolationImage", "s", "ops"}},
		{"EnsureIsolationImageWith", []string{"EnsureIsolationImageWith", "sa{sv}", "ops", "0"}},
	}
	tests := []struct {
		name       string
		letThrough bool
		want       string
	}{
		{"Bus_policy_refuses_nobody", false, "Access denied"},
		{"Service_refuses_nobody_when_the_bus_lets_the_call_through", true, "is not root and not in group " + bus.AdminGroup},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := f.onPrivateBus(t)
			if tc.letThrough {
				allowNobody(t, b)
			}
			for _, c := range calls {
				args := append([]string{"call", bus.ImagesName, string(bus.ImagesPath), bus.ImagesInterface}, c.args...)
				if out := b.BusctlAs(t, "nobody", args...); !strings.Contains(out, tc.want) {
					t.Errorf("%s as nobody: busctl said %q, want %q", c.name, out, tc.want)
				}
			}
			if !f.present(t, tag) {
				t.Fatalf("a refused call removed %s", tag)
			}
			list, err := f.svc.ListImages(context.Background())
			if err != nil || !slices.ContainsFunc(list, func(i imageT) bool { return i.Tag == tag }) {
				t.Fatalf("a refused call dropped the record of %s: %v %v", tag, list, err)
			}
			// Reading stays open to everyone.
			if out := b.BusctlAs(t, "nobody", "call", bus.ImagesName, string(bus.ImagesPath), bus.ImagesInterface, "ListImages"); !strings.Contains(out, tag) {
				t.Errorf("ListImages as nobody said %q, want it to list %s", out, tag)
			}
			if out := b.BusctlAs(t, "nobody", "get-property", bus.ImagesName, string(bus.ImagesPath), bus.ImagesInterface, "Building"); strings.TrimSpace(out) != "u 0" {
				t.Errorf("Building as nobody said %q, want u 0", out)
			}
		})
	}
}

func TestBusctlIntrospectShowsTheInterfaceToEveryone(t *testing.T) {
	t.Parallel()
	cfg, _ := writeConfig(t, "")
	f := newService(t, cfg)
	b := f.onPrivateBus(t)
	out := b.BusctlAs(t, "nobody", "introspect", bus.ImagesName, string(bus.ImagesPath))
	for _, want := range []string{".EnsureIsolationImage", ".Build", ".ListImages", ".Clean", ".Progress", ".Finished", ".ImageCount", "org.freedesktop.DBus.Peer"} {
		if !strings.Contains(out, want) {
			t.Errorf("busctl introspect as nobody lacks %s:\n%s", want, out)
		}
	}
}

func TestBuildJobStreamsProgressAndFinishesWithTheTag(t *testing.T) {
	t.Parallel()
	cli := testdockerEngine(t)
	needBase(t, cli)
	cfg, _ := writeConfig(t, fmt.Sprintf("[[agents]]\nid = \"ops\"\n[agents.container_mode]\nenabled = true\n[agents.image_config]\nenabled = true\nenv_vars = { RUN_NONCE = %q }\n", nonce()))
	f := newService(t, cfg)
	b := f.onPrivateBus(t)
	conn := b.Conn(t)
	if err := conn.AddMatchSignal(dbus.WithMatchInterface(bus.ImagesInterface), dbus.WithMatchObjectPath(bus.ImagesPath)); err != nil {
		t.Fatal(err)
	}
	signals := make(chan *dbus.Signal, 1024)
	conn.Signal(signals)

	var job dbus.ObjectPath
	if err := imagesObject(conn).Call(bus.ImagesInterface+".Build", 0, map[string]dbus.Variant{"target": dbus.MakeVariant("ops")}).Store(&job); err != nil {
		t.Fatal(err)
	}
	var steps []uint32
	var lines []string
	timeout := time.After(5 * time.Minute)
	for {
		var sig *dbus.Signal
		select {
		case sig = <-signals:
		case <-timeout:
			t.Fatalf("no Finished signal; progress so far: %v", lines)
		}
		if len(sig.Body) == 0 || sig.Body[0] != job {
			continue
		}
		if sig.Name == bus.ImagesInterface+".Progress" {
			steps = append(steps, sig.Body[1].(uint32))
			lines = append(lines, sig.Body[3].(string))
			continue
		}
		if sig.Name != bus.ImagesInterface+".Finished" {
			continue
		}
		tag, errText := sig.Body[1].(string), sig.Body[2].(string)
		f.removeImagesAtEnd(t, tag)
		if errText != "" || !strings.HasPrefix(tag, "berth-isolated:") {
			t.Fatalf("Finished(%q, %q), want an isolation tag and no error", tag, errText)
		}
		if !slices.IsSorted(steps) || steps[len(steps)-1] == 0 || !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "Step ") }) {
			t.Fatalf("Progress steps %v, lines %q: want rising steps with the builder's lines", steps, lines)
		}
		var state, jobTag string
		obj := conn.Object(bus.ImagesName, job)
		if err := obj.StoreProperty(bus.ImagesJobInterface+".State", &state); err != nil {
			t.Fatal(err)
		}
		if err := obj.StoreProperty(bus.ImagesJobInterface+".Tag", &jobTag); err != nil {
			t.Fatal(err)
		}
		if state != "succeeded" || jobTag != tag {
			t.Fatalf("job %s: State %q, Tag %q; want succeeded, %s", job, state, jobTag, tag)
		}
		return
	}
}

func TestBuildRefusesUnknownTargetsAndOptions(t *testing.T) {
	t.Parallel()
	cfg, _ := writeConfig(t, "")
	f := newService(t, cfg)
	conn := f.onPrivateBus(t).Conn(t)
	tests := []struct {
		name string
		opts map[string]dbus.Variant
		want string
	}{
		{"Unknown_agent", map[string]dbus.Variant{"target": dbus.MakeVariant("nobody-here")}, bus.ErrNotFound},
		{"Unknown_option", map[string]dbus.Variant{"colour": dbus.MakeVariant("blue")}, bus.ErrInvalidArgument},
		{"Option_of_the_wrong_type", map[string]dbus.Variant{"no_cache": dbus.MakeVariant("yes")}, bus.ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := imagesObject(conn).Call(bus.ImagesInterface+".Build", 0, tc.opts).Err
			if got := bus.ErrorName(err); got != tc.want {
				t.Fatalf("Build(%v) error %v (%s), want %s", tc.opts, err, got, tc.want)
			}
		})
	}
}

// stuckFetcher never finishes fetching: the build waits in its first step
// until it is canceled.
type stuckFetcher struct{ started chan struct{} }

func (f stuckFetcher) Fetch(ctx context.Context, _ []byte, _ []string, _ string, _ func(string)) ([]string, error) {
	close(f.started)
	<-ctx.Done()
	return nil, ctx.Err()
}

func TestCancelingAJobStopsItsBuild(t *testing.T) {
	t.Parallel()
	cli := testdockerEngine(t)
	needBase(t, cli)
	cfg, _ := writeConfig(t, "[[agents]]\nid = \"ops\"\n[agents.image_config]\nenabled = true\npackages = [\"jq\"]\n")
	fetcher := stuckFetcher{started: make(chan struct{})}
	f := newServiceWith(t, cfg, images.Options{Fetcher: fetcher})
	conn := f.onPrivateBus(t).Conn(t)
	if err := conn.AddMatchSignal(dbus.WithMatchInterface(bus.ImagesInterface), dbus.WithMatchMember("Finished")); err != nil {
		t.Fatal(err)
	}
	finished := make(chan *dbus.Signal, 8)
	conn.Signal(finished)
	var job dbus.ObjectPath
	if err := imagesObject(conn).Call(bus.ImagesInterface+".Build", 0, map[string]dbus.Variant{"target": dbus.MakeVariant("ops")}).Store(&job); err != nil {
		t.Fatal(err)
	}
	<-fetcher.started
	if err := conn.Object(bus.ImagesName, job).Call(bus.ImagesJobInterface+".Cancel", 0).Err; err != nil {
		t.Fatal(err)
	}
	select {
	case sig := <-finished:
		if sig.Body[0] != job || sig.Body[1] != "" || sig.Body[2] == "" {
			t.Fatalf("Finished%v, want job %s with no tag and an error", sig.Body, job)
		}
	case <-time.After(time.Minute):
		t.Fatal("a canceled job never finished")
	}
	var state string
	if err := conn.Object(bus.ImagesName, job).StoreProperty(bus.ImagesJobInterface+".State", &state); err != nil || state != "canceled" {
		t.Fatalf("State of a canceled job: %q (%v), want canceled", state, err)
	}
	if f.svc.Building() != 0 {
		t.Fatalf("Building = %d after the cancel, want 0", f.svc.Building())
	}
}
