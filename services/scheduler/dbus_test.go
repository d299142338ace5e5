package scheduler

import (
	"context"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/berth-dev/berth/internal/testkit/testenv"

	"github.com/godbus/dbus/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/isolation"
)

// exported starts a private bus and a running scheduler that owns
// dev.berth.Scheduler1 on it.
func exported(t *testing.T) (*testbus.Bus, *Service, *gateBackend) {
	t.Helper()
	backend := newGateBackend("landlock")
	b, s := exportedIn(t, "", backend)
	return b, s, backend
}

// exportedIn is exported with the store in dir and the given backend.
func exportedIn(t *testing.T, dir string, backend isolation.Backend) (*testbus.Bus, *Service) {
	t.Helper()
	_, err := exec.LookPath("dbus-daemon")
	testenv.Need(t, err == nil, "dbus-daemon is not installed")
	b := testbus.Start(t, testbus.Options{})
	gate, _ := backend.(*gateBackend)
	if gate == nil {
		gate = newGateBackend("unused")
	}
	s := newTestService(t, testConfig(4), dir, gate, nil, func(o *Options) {
		o.Backends = map[string]isolation.Backend{"landlock": backend}
	})
	if err := s.Export(b.Conn(t)); err != nil {
		t.Fatalf("Export: %v", err)
	}
	start(t, s)
	return b, s
}

func scheduler(conn *dbus.Conn) dbus.BusObject {
	return conn.Object(bus.SchedulerName, bus.SchedulerPath)
}

// signals subscribes conn to the scheduler's signals.
func signals(t *testing.T, conn *dbus.Conn) chan *dbus.Signal {
	t.Helper()
	if err := conn.AddMatchSignal(dbus.WithMatchObjectPath(bus.SchedulerPath)); err != nil {
		t.Fatal(err)
	}
	ch := make(chan *dbus.Signal, 100)
	conn.Signal(ch)
	return ch
}

// waitSignal returns the body of the next signal called name whose first
// argument is arg0 (any, when empty).
func waitSignal(t *testing.T, ch chan *dbus.Signal, name, arg0 string) []any {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case sig := <-ch:
			if sig.Name != name {
				continue
			}
			if first, _ := sig.Body[0].(string); arg0 == "" || first == arg0 {
				return sig.Body
			}
		case <-timeout:
			t.Fatalf("no signal %s(%s) within 10s", name, arg0)
		}
	}
}

func TestDBusSurface(t *testing.T) {
	t.Parallel()
	b, _, backend := exported(t)
	client := b.Conn(t)
	sigs := signals(t, client)
	obj := scheduler(client)

	var runID string
	msg := map[string]string{"id": "m1", "agent": "alpha", "text": "hello", "connector": "hook"}
	if err := obj.Call(bus.SchedulerInterface+".Submit", 0, msg).Store(&runID); err != nil {
		t.Fatalf("Submit: %v", err)
	}
	var again string
	if err := obj.Call(bus.SchedulerInterface+".Submit", 0, msg).Store(&again); err != nil || again != runID {
		t.Fatalf("second Submit = %q, %v; want %q", again, err, runID)
	}
	if body := waitSignal(t, sigs, "dev.berth.Scheduler1.RunStateChanged", runID); body[1] != "alpha" || body[2] != StateQueued {
		t.Fatalf("RunStateChanged = %v", body)
	}
	waitSignal(t, sigs, "dev.berth.Scheduler1.RunStateChanged", runID) // running
	run := backend.next(t)

	var running uint32
	if err := obj.Call("org.freedesktop.DBus.Properties.Get", 0, bus.SchedulerInterface, "Running").Store(&running); err != nil {
		t.Fatalf("Get Running: %v", err)
	}
	if running != 1 {
		t.Fatalf("Running = %d, want 1", running)
	}

	run.reply("hi there")
	body := waitSignal(t, sigs, "dev.berth.Scheduler1.RunFinished", runID)
	if len(body) != 4 || body[2] != StateSucceeded || body[3] != "" {
		t.Fatalf("RunFinished = %v, want (run_id, agent, succeeded, no reason)", body)
	}
	for _, v := range body {
		if v == "hi there" {
			t.Fatalf("RunFinished broadcast the reply text to the whole bus: %v", body)
		}
	}

	var got map[string]dbus.Variant
	if err := obj.Call(bus.SchedulerInterface+".GetRun", 0, runID).Store(&got); err != nil {
		t.Fatalf("GetRun: %v", err)
	}
	if got["state"].Value() != StateSucceeded || got["reply"].Value() != "hi there" || got["attempts"].Value() != uint32(1) || got["tool_calls"].Value() != "[]" {
		t.Fatalf("GetRun = %v", got)
	}
	for _, key := range []string{"id", "message_id", "agent", "reason", "error", "connector", "channel", "thread", "author", "text", "created_usec", "started_usec", "finished_usec", "delivered", "backend"} {
		if _, ok := got[key]; !ok {
			t.Errorf("GetRun has no key %q", key)
		}
	}

	// A second run, queued behind nothing, then canceled while running.
	var second string
	if err := obj.Call(bus.SchedulerInterface+".Submit", 0, map[string]string{"id": "m2", "agent": "alpha"}).Store(&second); err != nil {
		t.Fatal(err)
	}
	backend.next(t)
	if err := obj.Call(bus.SchedulerInterface+".CancelRun", 0, second).Err; err != nil {
		t.Fatalf("CancelRun: %v", err)
	}
	waitSignal(t, sigs, "dev.berth.Scheduler1.RunFinished", second)

	tests := []struct {
		name   string
		filter map[string]dbus.Variant
		want   []string
	}{
		{"All_runs_newest_first", map[string]dbus.Variant{}, []string{second, runID}},
		{"Filtered_by_state", map[string]dbus.Variant{"state": dbus.MakeVariant(StateCanceled)}, []string{second}},
		{"Filtered_by_agent", map[string]dbus.Variant{"agent": dbus.MakeVariant("beta")}, nil},
		{"Limited", map[string]dbus.Variant{"limit": dbus.MakeVariant(uint32(1))}, []string{second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var runs []map[string]dbus.Variant
			if err := obj.Call(bus.SchedulerInterface+".ListRuns", 0, tc.filter).Store(&runs); err != nil {
				t.Fatalf("ListRuns: %v", err)
			}
			var ids []string
			for _, r := range runs {
				ids = append(ids, r["id"].Value().(string))
			}
			if strings.Join(ids, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("ListRuns = %v, want %v", ids, tc.want)
			}
		})
	}

	errTests := []struct {
		name     string
		method   string
		args     []any
		wantName string
	}{
		{"Unknown_agent_is_an_invalid_argument", "Submit", []any{map[string]string{"id": "m3", "agent": "zeta"}}, bus.ErrInvalidArgument},
		{"Unknown_run_is_not_found", "GetRun", []any{"nope"}, bus.ErrNotFound},
		{"Canceling_a_finished_run_is_an_invalid_argument", "CancelRun", []any{runID}, bus.ErrInvalidArgument},
		{"Unknown_filter_key_is_an_invalid_argument", "ListRuns", []any{map[string]dbus.Variant{"colour": dbus.MakeVariant("red")}}, bus.ErrInvalidArgument},
	}
	for _, tc := range errTests {
		t.Run(tc.name, func(t *testing.T) {
			err := obj.Call(bus.SchedulerInterface+"."+tc.method, 0, tc.args...).Err
			if name := bus.ErrorName(err); name != tc.wantName {
				t.Fatalf("%s error = %v (%s), want %s", tc.method, err, name, tc.wantName)
			}
		})
	}
}

func TestDBusPropertiesChangeWithTheQueue(t *testing.T) {
	t.Parallel()
	b, _, backend := exported(t)
	client := b.Conn(t)
	sigs := signals(t, client)
	obj := scheduler(client)
	for _, id := range []string{"m1", "m2"} {
		if err := obj.Call(bus.SchedulerInterface+".Submit", 0, map[string]string{"id": id, "agent": "alpha"}).Err; err != nil {
			t.Fatal(err)
		}
	}
	backend.next(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var all map[string]dbus.Variant
		if err := obj.Call("org.freedesktop.DBus.Properties.GetAll", 0, bus.SchedulerInterface).Store(&all); err != nil {
			t.Fatalf("GetAll: %v", err)
		}
		if all["QueueDepth"].Value() == uint32(1) && all["Running"].Value() == uint32(1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("properties = %v, want QueueDepth 1 and Running 1", all)
		}
		time.Sleep(10 * time.Millisecond)
	}
	body := waitSignal(t, sigs, "org.freedesktop.DBus.Properties.PropertiesChanged", bus.SchedulerInterface)
	if changed, ok := body[1].(map[string]dbus.Variant); !ok || len(changed) == 0 {
		t.Fatalf("PropertiesChanged = %v", body)
	}
}

func TestDBusIntrospectionIsComplete(t *testing.T) {
	t.Parallel()
	b, _, _ := exported(t)
	var data string
	if err := scheduler(b.Conn(t)).Call("org.freedesktop.DBus.Introspectable.Introspect", 0).Store(&data); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`interface name="dev.berth.Scheduler1"`, `method name="Submit"`, `property name="QueueDepth"`,
		`interface name="org.freedesktop.DBus.Properties"`, `interface name="org.freedesktop.DBus.Introspectable"`, `interface name="org.freedesktop.DBus.Peer"`} {
		if !strings.Contains(data, want) {
			t.Errorf("introspection lacks %s:\n%s", want, data)
		}
	}
	out, err := exec.Command("busctl", "--address="+b.Address, "tree", bus.SchedulerName).CombinedOutput()
	if err != nil || !strings.Contains(string(out), string(bus.SchedulerPath)) {
		t.Fatalf("busctl tree = %s (%v)", out, err)
	}
	// busctl refuses introspection data that lists an interface or a member
	// twice ("duplicate method"), which a grep would not notice.
	out, err = exec.Command("busctl", "--address="+b.Address, "introspect", bus.SchedulerName, string(bus.SchedulerPath)).CombinedOutput()
	if err != nil {
		t.Fatalf("busctl introspect: %s (%v)", out, err)
	}
	for _, want := range []string{".GetRunOutput", ".ListRuns", ".ExplainAgent", ".TestProviders", ".Quarantined", ".QueueDepth", ".RunFinished", "org.freedesktop.DBus.Peer", "org.freedesktop.DBus.Properties"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("busctl introspect lacks %s:\n%s", want, out)
		}
	}
	if n := strings.Count(string(out), "org.freedesktop.DBus.Peer "); n != 1 {
		t.Errorf("busctl introspect lists org.freedesktop.DBus.Peer %d times, want once:\n%s", n, out)
	}
}

func TestDBusSecondSchedulerCannotTakeTheName(t *testing.T) {
	t.Parallel()
	b, _, _ := exported(t)
	other := newTestService(t, testConfig(4), "", newGateBackend("landlock"), nil)
	err := other.Export(b.Conn(t))
	if err == nil || !strings.Contains(err.Error(), "another process owns it") {
		t.Fatalf("second Export error = %v, want the name to be taken", err)
	}
}

func TestDBusUnprivilegedCallerIsRefused(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Fatal("this test needs root: it acts as root and as user nobody")
	}
	b, s, _ := exported(t)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatalf("need user nobody: %v", err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	tests := []struct {
		name string
		args []string
	}{
		{"Submit_is_refused", []string{"Submit", "a{ss}", "2", "id", "m1", "agent", "alpha"}},
		{"CancelRun_is_refused", []string{"CancelRun", "s", "x"}},
		{"GetRun_is_refused", []string{"GetRun", "s", "x"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("busctl", append([]string{"--address=" + b.Address, "call", bus.SchedulerName, string(bus.SchedulerPath), bus.SchedulerInterface}, tc.args...)...)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), "Access denied") {
				t.Fatalf("busctl as nobody: %s (%v), want access denied", out, err)
			}
		})
	}
	if runs, _ := s.ListRuns(RunFilter{}); len(runs) != 0 {
		t.Fatalf("refused Submit still queued %d runs", len(runs))
	}
}

func listOverBus(t *testing.T, obj dbus.BusObject, filter map[string]dbus.Variant) ([]map[string]dbus.Variant, error) {
	t.Helper()
	var runs []map[string]dbus.Variant
	err := obj.Call(bus.SchedulerInterface+".ListRuns", 0, filter).Store(&runs)
	return runs, err
}

func TestListRunsOfHugeRunsStaysFarBelowTheBusLimit(t *testing.T) {
	t.Parallel()
	// 30 runs of 1.5 MB text and 0.5 MB reply: 60 MB in all, far above
	// dbus-daemon's 32 MiB default message limit (Debian's system bus too).
	dir := t.TempDir()
	text, reply := strings.Repeat("t", 1500000), strings.Repeat("é", 250000)
	base := time.Now()
	var seeded []Run
	for i := range 30 {
		at := base.Add(time.Duration(i) * time.Millisecond)
		seeded = append(seeded, Run{ID: newRunID(at), MessageID: newRunID(at), Agent: "alpha", State: StateSucceeded,
			Text: text, Reply: reply, Delivered: true, CreatedAt: at, FinishedAt: at})
	}
	writeRuns(t, dir, seeded...)
	b, _ := exportedIn(t, dir, newGateBackend("landlock"))
	client := b.Conn(t)
	obj := scheduler(client)

	runs, err := listOverBus(t, obj, map[string]dbus.Variant{})
	if err != nil || len(runs) != 30 {
		t.Fatalf("ListRuns = %d runs, %v; want 30", len(runs), err)
	}
	for _, r := range runs {
		if _, ok := r["text"]; ok {
			t.Fatal("ListRuns returned a full text")
		}
		if p := r["reply_preview"].Value().(string); utf8.RuneCountInString(p) != previewChars || r["text_bytes"].Value() != uint32(len(text)) || r["reply_bytes"].Value() != uint32(len(reply)) {
			t.Fatalf("summary preview %d chars, sizes %v/%v", utf8.RuneCountInString(p), r["text_bytes"], r["reply_bytes"])
		}
	}

	t.Run("Pages_follow_each_other_through_the_before_cursor", func(t *testing.T) {
		var ids []string
		before := ""
		for page := 0; page < 10; page++ {
			filter := map[string]dbus.Variant{"limit": dbus.MakeVariant(uint32(7))}
			if before != "" {
				filter["before"] = dbus.MakeVariant(before)
			}
			runs, err := listOverBus(t, obj, filter)
			if err != nil {
				t.Fatal(err)
			}
			if len(runs) == 0 {
				break
			}
			for _, r := range runs {
				ids = append(ids, r["id"].Value().(string))
			}
			before = ids[len(ids)-1]
		}
		if len(ids) != 30 || ids[0] != seeded[29].ID || ids[29] != seeded[0].ID {
			t.Fatalf("pages gave %d ids from %s to %s; want all 30 newest first", len(ids), ids[0], ids[len(ids)-1])
		}
	})
	t.Run("GetRun_cuts_long_texts_and_GetRunOutput_pages_the_rest", func(t *testing.T) {
		var got map[string]dbus.Variant
		if err := obj.Call(bus.SchedulerInterface+".GetRun", 0, seeded[3].ID).Store(&got); err != nil {
			t.Fatal(err)
		}
		if len(got["text"].Value().(string)) != maxFieldBytes || got["text_cut"].Value() != true || got["text_bytes"].Value() != uint32(len(text)) {
			t.Fatalf("GetRun text %d bytes, cut %v, of %v", len(got["text"].Value().(string)), got["text_cut"], got["text_bytes"])
		}
		if got["reply"].Value() != reply || got["reply_cut"].Value() != false {
			t.Fatal("a reply below the bound was cut")
		}
		var whole strings.Builder
		for offset, pages := uint64(0), 0; ; pages++ {
			var chunk string
			var next uint64
			if err := obj.Call(bus.SchedulerInterface+".GetRunOutput", 0, seeded[3].ID, "text", offset).Store(&chunk, &next); err != nil {
				t.Fatal(err)
			}
			whole.WriteString(chunk)
			if next == 0 {
				break
			}
			if pages > 3 {
				t.Fatal("GetRunOutput does not end")
			}
			offset = next
		}
		if whole.String() != text {
			t.Fatalf("GetRunOutput pages gave %d bytes, want %d", whole.Len(), len(text))
		}
	})
	t.Run("Bad_requests_are_invalid_arguments", func(t *testing.T) {
		for _, filter := range []map[string]dbus.Variant{
			{"limit": dbus.MakeVariant(uint32(501))},
			{"state": dbus.MakeVariant("sleeping")},
		} {
			if _, err := listOverBus(t, obj, filter); bus.ErrorName(err) != bus.ErrInvalidArgument {
				t.Fatalf("ListRuns(%v) error = %v, want InvalidArgument", filter, err)
			}
		}
		err := obj.Call(bus.SchedulerInterface+".GetRunOutput", 0, seeded[0].ID, "colour", uint64(0)).Err
		if bus.ErrorName(err) != bus.ErrInvalidArgument {
			t.Fatalf("GetRunOutput(colour) = %v, want InvalidArgument", err)
		}
	})
	// The scheduler is still on the bus and working.
	var id string
	if err := obj.Call(bus.SchedulerInterface+".Submit", 0, map[string]string{"id": "after", "agent": "alpha"}).Store(&id); err != nil || id == "" {
		t.Fatalf("Submit after the big lists: %q, %v", id, err)
	}
}

func TestQuarantinedRecordsAreCountedOnTheBus(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeRuns(t, dir, Run{ID: "r1", MessageID: "m1", Agent: "alpha", State: StateQueued, Seq: 1, CreatedAt: time.Now()})
	st, err := openStore(dir + "/" + DBName)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.db.Update(func(tx *bolt.Tx) error { return runsBucket(tx).Put([]byte("r1"), []byte("}{")) }); err != nil {
		t.Fatal(err)
	}
	st.close()
	b, _ := exportedIn(t, dir, newGateBackend("landlock"))
	obj := scheduler(b.Conn(t))
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n uint32
		if err := obj.Call("org.freedesktop.DBus.Properties.Get", 0, bus.SchedulerInterface, "Quarantined").Store(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Quarantined = %d, want 1", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// hangingKill is a backend whose Kill does not return until released (or
// its deadline passes): an engine that accepts and never answers.
type hangingKill struct {
	*gateBackend
	killing chan string
	release chan struct{}
}

func (h *hangingKill) Kill(ctx context.Context, handle string) error {
	h.killing <- handle
	select {
	case <-h.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func TestAKillThatNeverReturnsFreezesNoBusCall(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeRuns(t, dir, Run{ID: "orphan", MessageID: "m0", Agent: "alpha", State: StateRunning, Backend: "landlock",
		Handle: "pid:1", Attempts: 1, Seq: 1, CreatedAt: time.Now()})
	h := &hangingKill{gateBackend: newGateBackend("landlock"), killing: make(chan string, 4), release: make(chan struct{})}
	b, _ := exportedIn(t, dir, h)
	<-h.killing // reconcile is now inside Kill

	obj := scheduler(b.Conn(t))
	call := func(method string, args ...any) *dbus.Call {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return obj.CallWithContext(ctx, method, 0, args...)
	}
	var id string
	if err := call(bus.SchedulerInterface+".Submit", map[string]string{"id": "m1", "agent": "beta"}).Store(&id); err != nil {
		t.Fatalf("Submit during a hung Kill: %v", err)
	}
	for _, c := range []struct {
		method string
		args   []any
	}{
		{bus.SchedulerInterface + ".GetRun", []any{id}},
		{bus.SchedulerInterface + ".ListRuns", []any{map[string]dbus.Variant{}}},
		{"org.freedesktop.DBus.Properties.GetAll", []any{bus.SchedulerInterface}},
	} {
		if err := call(c.method, c.args...).Err; err != nil {
			t.Fatalf("%s during a hung Kill: %v", c.method, err)
		}
	}
	close(h.release)
	first := h.next(t)
	second := h.next(t)
	if got := map[string]bool{first.spec.RunID: true, second.spec.RunID: true}; !got["orphan"] || !got[id] {
		t.Fatalf("after the kill returned, runs %s and %s started; want orphan and %s", first.spec.RunID, second.spec.RunID, id)
	}
	first.reply("ok")
	second.reply("ok")
}
