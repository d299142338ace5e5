package daemon

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestJournalFieldNamesAreValid(t *testing.T) {
	t.Parallel()
	tests := []struct{ key, want string }{
		{"run_id", "RUN_ID"},
		{"agent", "AGENT"},
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
