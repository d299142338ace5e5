package hostrun_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testenv"
	"github.com/berth-dev/berth/isolation"
)

// buildStatic builds pkg into base as berth-agent ships it (CGO_ENABLED=0:
// it changes every thread's capabilities, which a cgo build cannot).
func buildStatic(t *testing.T, name, pkg string) string {
	t.Helper()
	bin, err := testenv.BuildStatic(base, name, pkg)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// A scheduler that is not root cannot mount anything itself: berth-agent,
// cloned into user, mount and IPC namespaces of its own, masks the host's
// socket directories before it reads on, and its tools find a socket under
// /run gone. A kernel that refuses the namespaces fails the run closed.
func TestRunAsNonRootHidesTheHostsSocketsOrFailsClosed(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	dir, err := os.MkdirTemp("/run", "berth-test-nonroot-")
	testenv.Need(t, err == nil, "cannot make a directory under /run: %v", err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "service.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if err := os.Chmod(socket, 0o777); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	agent := buildStatic(t, "berth-agent-nonroot", "github.com/berth-dev/berth/cmd/berth-agent")
	probe := buildStatic(t, "sysprobe", "../landlock/testdata/sysprobe")

	out := runAsNobody(t, "",
		"HELPER_AGENT="+agent,
		"HELPER_ALLOW_READ="+probe,
		"HELPER_TEXT=/sh "+probe+" connect "+socket+"; "+probe+" addkey process; "+probe+" caps")
	if out.Reason != "" {
		if out.Reason != isolation.ReasonConfinement {
			t.Fatalf("got %q (%s), want a run or a confinement failure", out.Reason, out.Error)
		}
		t.Logf("the kernel refused the namespaces; the run failed closed: %s", out.Error)
		return
	}
	for _, want := range []string{
		"connect " + socket + " refused: dial unix " + socket + ": connect: no such file or directory",
		"addkey process refused: operation not permitted",
		"caps effective=0 permitted=0 ok",
	} {
		if !strings.Contains(out.Reply, want) {
			t.Errorf("reply lacks %q:\n%s", want, out.Reply)
		}
	}
}
