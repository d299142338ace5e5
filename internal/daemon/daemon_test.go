package daemon

import (
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/journal"
)

func TestJournalFieldNamesAreValid(t *testing.T) {
	t.Parallel()
	tests := []struct{ key, want string }{
		{"run_id", "RUN_ID"},
		{"agent", "AGENT"},
		{"connector", "CONNECTOR"},
		{"message_id", "MESSAGE_ID"},
		{"backend", "BACKEND"},
		{"http.status", "HTTP_STATUS"},
		{"_private", "PRIVATE"},
		{"9lives", "F_9LIVES"},
		{"message", "BERTH_MESSAGE"},
	}
	for _, tc := range tests {
		if got := journalField(tc.key); got != tc.want {
			t.Errorf("journalField(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}

// journalEntry is one entry the JournalHandler sent.
type journalEntry struct {
	message  string
	priority journal.Priority
	fields   map[string]string
}

func TestJournalEntriesCarryTheFieldsAdminsMatchOn(t *testing.T) {
	t.Parallel()
	var entries []journalEntry
	h := &JournalHandler{Identifier: "berth-scheduler", Level: slog.LevelInfo,
		Send: func(msg string, p journal.Priority, fields map[string]string) error {
			entries = append(entries, journalEntry{msg, p, fields})
			return nil
		}}
	log := slog.New(h).With("service", "berth-scheduler")
	runLog := log.With("run_id", "r-42", "agent", "ops")
	runLog.Info("run finished", "backend", "landlock", "connector", "hooks", "message_id", "m-7")
	runLog.Error("run failed: timeout")
	log.Debug("not at info level")

	if len(entries) != 2 {
		t.Fatalf("%d entries, want 2 (debug is below the level)", len(entries))
	}
	want := map[string]string{
		"SYSLOG_IDENTIFIER": "berth-scheduler", "SERVICE": "berth-scheduler",
		"RUN_ID": "r-42", "AGENT": "ops", "BACKEND": "landlock", "CONNECTOR": "hooks", "MESSAGE_ID": "m-7",
	}
	for k, v := range want {
		if got := entries[0].fields[k]; got != v {
			t.Errorf("field %s = %q, want %q (journalctl %s=%s must find the entry); fields: %v", k, got, v, k, v, entries[0].fields)
		}
	}
	if entries[0].message != "run finished" || entries[0].priority != journal.PriInfo {
		t.Errorf("entry 0: %q at priority %d, want the message text at info", entries[0].message, entries[0].priority)
	}
	if e := entries[1]; e.priority != journal.PriErr || e.fields["RUN_ID"] != "r-42" || e.message != "run failed: timeout" {
		t.Errorf("an error entry: %q at priority %d with RUN_ID=%q, want err priority and the run's fields", e.message, e.priority, e.fields["RUN_ID"])
	}
}

func TestStateDirPrefersFlagThenSystemdThenBase(t *testing.T) {
	base := t.TempDir()
	t.Setenv("STATE_DIRECTORY", "")
	t.Setenv("BERTH_STATE_DIR", base)
	got, err := StateDir("", "intake")
	if err != nil || got != filepath.Join(base, "intake") {
		t.Fatalf("with BERTH_STATE_DIR: %q %v", got, err)
	}
	sd := filepath.Join(base, "from-systemd")
	t.Setenv("STATE_DIRECTORY", sd)
	if got, _ := StateDir("", "intake"); got != sd {
		t.Fatalf("with STATE_DIRECTORY: %q, want %q", got, sd)
	}
	flag := filepath.Join(base, "flag")
	if got, _ := StateDir(flag, "intake"); got != flag {
		t.Fatalf("with flag: %q, want %q", got, flag)
	}
	if fi, err := os.Stat(flag); err != nil || !fi.IsDir() {
		t.Fatalf("state dir was not created: %v", err)
	}
}

// The child half of TestActivationListeners: it runs with fd 3 inherited, as
// systemd passes it, and reports what ActivationListeners made of it.
func TestMain(m *testing.M) {
	if name := os.Getenv("BERTH_TEST_ACTIVATION_CHILD"); name != "" {
		os.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()))
		ls, err := ActivationListeners(name)
		if err != nil {
			os.Stdout.WriteString("error: " + err.Error())
			os.Exit(0)
		}
		for _, l := range ls {
			os.Stdout.WriteString("listener " + l.Addr().String())
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestActivationListenersFindsTheSocketByName(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f, err := l.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	run := func(want, fdName string) string {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "BERTH_TEST_ACTIVATION_CHILD="+want, "LISTEN_FDS=1", "LISTEN_FDNAMES="+fdName)
		cmd.ExtraFiles = []*os.File{f}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("child: %v", err)
		}
		return string(out)
	}
	if got := run("http", "http"); got != "listener "+l.Addr().String() {
		t.Fatalf("named socket: got %q, want the listener on %s", got, l.Addr())
	}
	if got := run("http", "metrics"); !strings.Contains(got, "FileDescriptorName=http") {
		t.Fatalf("wrongly named socket: got %q, want an error telling to set FileDescriptorName=http", got)
	}
}
