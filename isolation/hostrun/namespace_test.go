package hostrun_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
)

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
	testenv.Need(t, berthAgentBuild == nil, "cannot build berth-agent: %v", berthAgentBuild)
	probe, err := testenv.BuildStatic(base, "sysprobe", "../landlock/testdata/sysprobe")
	if err != nil {
		t.Fatal(err)
	}

	out := runAsNobody(t, "",
		"HELPER_AGENT="+berthAgent,
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
