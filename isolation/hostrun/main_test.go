package hostrun_test

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
	"testing"

	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// base is a 0755 directory every test user can enter (t.TempDir's parent is
// 0700); the test agent binary lives in it, and the real berth-agent.
var base, testAgent, berthAgent string

// berthAgentBuild says why the real berth-agent could not be built, if so.
var berthAgentBuild error

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelper())
	}
	if os.Getenv(keepHelperEnv) != "" {
		os.Exit(runKeepHelper())
	}
	var err error
	base, err = os.MkdirTemp("", "berth-hostrun-")
	if err == nil {
		err = os.Chmod(base, 0o755)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot create test dir:", err)
		os.Exit(1)
	}
	if testAgent, err = testenv.Build(base, "testagent", "./testdata/testagent"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(base)
		os.Exit(1)
	}
	// Static, as it ships: the non-root namespace test needs that (it
	// changes every thread's capabilities), and one build serves all.
	berthAgent, berthAgentBuild = testenv.BuildStatic(base, "berth-agent", "github.com/berth-dev/berth/cmd/berth-agent")
	code := m.Run()
	os.RemoveAll(base)
	os.Exit(code)
}

// nobody returns the uid and gid of user "nobody".
func nobody(t *testing.T) (int, int) {
	t.Helper()
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Fatalf("cannot find user nobody: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return uid, gid
}

// workspace makes a workspace under base owned by nobody.
func workspace(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(base, "ws-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	uid, gid := nobody(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	return dir
}

func requireRoot(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t)
}
