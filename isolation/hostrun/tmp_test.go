package hostrun_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/hostrun"
)

// probeBuild is ../landlock/testdata/sysprobe (what a hostile tool runs),
// built once for the tests of this file.
var probeBuild struct {
	once sync.Once
	path string
	err  error
}

func sysprobe(t *testing.T) string {
	t.Helper()
	probeBuild.once.Do(func() {
		probeBuild.path, probeBuild.err = testenv.BuildStatic(base, "sysprobe-tmp", "../landlock/testdata/sysprobe")
	})
	if probeBuild.err != nil {
		t.Fatal(probeBuild.err)
	}
	return probeBuild.path
}

// listenWorldWritable listens on a named socket at path that every user may
// connect to (as PostgreSQL's /tmp/.s.PGSQL.5432 or a tmux session's is),
// accepting until the test ends.
func listenWorldWritable(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); os.Remove(path) })
	if err := os.Chmod(path, 0o777); err != nil {
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
}

// toolRun runs command through the shell tool of the real berth-agent as
// nobody, confined (the sysprobe readable) or unrestricted, and returns the
// reply.
func toolRun(t *testing.T, unrestricted bool, command string) string {
	t.Helper()
	s := landlockSpec(t, "/sh "+command)
	s.Policy = isolation.HostPolicy(isolation.FileAccess{AllowRead: []string{sysprobe(t)}, Unrestricted: unrestricted}, s.Workspace, nil)
	res, err := hostrun.Runner{}.Run(context.Background(), s)
	if err != nil {
		t.Fatalf("run failed: %v\nstderr: %s", err, res.Stderr)
	}
	return res.Response.Reply
}

// lineOf is the line of reply that starts with what, or says there is none.
func lineOf(reply, what string) string {
	for _, line := range strings.Split(reply, "\n") {
		if strings.HasPrefix(line, what) {
			return line
		}
	}
	return fmt.Sprintf("(no line starting %q)", what)
}

// uniqueName is a name under /tmp or /var/tmp no other test uses.
func uniqueName(t *testing.T, dir, prefix string) string {
	t.Helper()
	f, err := os.CreateTemp(dir, prefix)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Remove(f.Name())
	return f.Name()
}

// Landlock does not govern connect() on a path socket, so a world-writable
// socket in the host's /tmp or /var/tmp was reachable from every tool. A
// confined run has a /tmp and /var/tmp of its own: the host's sockets there
// are not even visible; an unrestricted run (the control) reaches them.
func TestAConfinedRunCannotReachASocketInTheHostsTmp(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	inTmp := uniqueName(t, "/tmp", ".s.PGSQL.")
	inVarTmp := uniqueName(t, "/var/tmp", "berth-test-tmux-")
	listenWorldWritable(t, inTmp)
	listenWorldWritable(t, inVarTmp)
	probe := sysprobe(t)
	command := fmt.Sprintf("%[1]s connect %[2]s; %[1]s connect %[3]s; for s in %[2]s %[3]s; do if [ -e $s ]; then echo sees $s; else echo no $s; fi; done",
		probe, inTmp, inVarTmp)

	confined := toolRun(t, false, command)
	control := toolRun(t, true, command)
	for _, socket := range []string{inTmp, inVarTmp} {
		if got := lineOf(confined, "connect "+socket); !strings.HasSuffix(got, "connect: no such file or directory") {
			t.Errorf("confined run: %q, want no such file\nreply:\n%s", got, confined)
		}
		if got := lineOf(confined, "no "+socket); got != "no "+socket {
			t.Errorf("confined run sees the host's socket %s\nreply:\n%s", socket, confined)
		}
		if got := lineOf(control, "connect "+socket); !strings.HasSuffix(got, " ok") {
			t.Errorf("unrestricted run (the control): %q, want it to get through\nreply:\n%s", got, control)
		}
	}
}

// A confined run's /tmp and /var/tmp are its own: nothing of the host's is
// in them (only the paths of its plan that lie under /tmp, bound back), they
// are writable and executable as a container's /tmp, hold 256 MiB and no
// more (ENOSPC), and what a run left there is gone with it: not on the host,
// not in the next run.
func TestAConfinedRunsTmpIsItsOwnBoundedAndGoneAfterIt(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	hostFile := uniqueName(t, "/tmp", "berth-test-host-file-")
	if err := os.WriteFile(hostFile, []byte("the host's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(hostFile) })
	left := filepath.Base(uniqueName(t, "/tmp", "berth-test-left-by-run-"))
	var script []string
	for _, dir := range []string{"/tmp", "/var/tmp"} {
		script = append(script,
			fmt.Sprintf("echo %s holds: $(ls -A %s)", dir, dir),
			fmt.Sprintf("echo written > %s/%s && echo %s written", dir, left, dir),
			fmt.Sprintf("dd if=/dev/zero of=%s/fill bs=1M count=300 2>&1 | grep -o 'No space left on device' | sed 's|^|%s fill: |'", dir, dir),
			// What else the run wrote there takes a page or two.
			fmt.Sprintf("echo %s filled $(( ($(stat -c %%s %s/fill) + (1 << 20) - 1) >> 20 )) MiB; rm %s/fill", dir, dir, dir),
		)
	}
	script = append(script, "cp /bin/true /tmp/own-true && /tmp/own-true && echo ran from /tmp")
	reply := toolRun(t, false, strings.Join(script, "; "))

	// The test's own paths (the probe, the workspace, berth-agent) may lie
	// under /tmp: bound back, they are the only entry there.
	var kept []string
	if rel, err := filepath.Rel("/tmp", base); err == nil && !strings.HasPrefix(rel, "..") {
		kept = append(kept, strings.Split(rel, "/")[0])
	}
	want := map[string]string{
		"/tmp holds:":      strings.TrimSpace("/tmp holds: " + strings.Join(kept, " ")),
		"/var/tmp holds:":  "/var/tmp holds:",
		"/tmp written":     "/tmp written",
		"/var/tmp written": "/var/tmp written",
		"/tmp fill:":       "/tmp fill: No space left on device",
		"/var/tmp fill:":   "/var/tmp fill: No space left on device",
		"/tmp filled":      "/tmp filled 256 MiB",
		"/var/tmp filled":  "/var/tmp filled 256 MiB",
		"ran from /tmp":    "ran from /tmp",
	}
	for prefix, line := range want {
		if got := lineOf(reply, prefix); got != line {
			t.Errorf("got %q, want %q\nreply:\n%s", got, line, reply)
		}
	}
	for _, dir := range []string{"/tmp", "/var/tmp"} {
		if _, err := os.Stat(filepath.Join(dir, left)); err == nil {
			t.Errorf("the run's %s/%s is on the host after the run", dir, left)
			os.Remove(filepath.Join(dir, left))
		}
	}
	next := toolRun(t, false, fmt.Sprintf("echo missing: $(ls -A /tmp/%[1]s /var/tmp/%[1]s 2>&1 | grep -c 'No such file')", left))
	if got := lineOf(next, "missing:"); got != "missing: 2" {
		t.Errorf("the next run finds what the last one left in /tmp or /var/tmp: %q", next)
	}
}

// A non-root scheduler's runs get the same /tmp and /var/tmp: berth-agent
// mounts them itself in its user namespace (or the run fails closed where
// the kernel refuses the namespaces).
func TestARunOfANonRootSchedulerHasItsOwnTmpToo(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	testenv.Need(t, berthAgentBuild == nil, "cannot build berth-agent: %v", berthAgentBuild)
	inTmp := uniqueName(t, "/tmp", ".s.PGSQL.")
	listenWorldWritable(t, inTmp)
	probe := sysprobe(t)
	out := runAsNobody(t, "",
		"HELPER_AGENT="+berthAgent,
		"HELPER_ALLOW_READ="+probe,
		"HELPER_TEXT=/sh "+probe+" connect "+inTmp+"; echo written > /tmp/own && echo /tmp written; "+
			"dd if=/dev/zero of=/var/tmp/fill bs=1M count=300 2>&1 | grep -o 'No space left on device' | sed 's|^|/var/tmp fill: |'")
	if out.Reason != "" {
		if out.Reason != isolation.ReasonConfinement {
			t.Fatalf("got %q (%s), want a run or a confinement failure", out.Reason, out.Error)
		}
		t.Logf("the kernel refused the namespaces; the run failed closed: %s", out.Error)
		return
	}
	for prefix, want := range map[string]string{
		"connect " + inTmp: "connect " + inTmp + " refused: dial unix " + inTmp + ": connect: no such file or directory",
		"/tmp written":     "/tmp written",
		"/var/tmp fill:":   "/var/tmp fill: No space left on device",
	} {
		if got := lineOf(out.Reply, prefix); got != want {
			t.Errorf("got %q, want %q\nreply:\n%s", got, want, out.Reply)
		}
	}
}

// The run's /tmp is read-write to Landlock, so what the plan keeps visible
// under the host's /tmp (a read-only allow path, berth-agent where a
// quickstart put it) is bound back read-only: it must not become writable
// with the run's /tmp, on either side that masks.
func TestAReadOnlyPathKeptUnderTmpStaysReadOnly(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	readOnly, err := os.CreateTemp(base, "read-only-")
	if err != nil {
		t.Fatal(err)
	}
	readOnly.WriteString("as it was\n")
	readOnly.Close()
	t.Cleanup(func() { os.Remove(readOnly.Name()) })
	uid, gid := nobody(t)
	// DAC would let the run's user write it: only the bind stops it.
	if err := os.Chown(readOnly.Name(), uid, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(readOnly.Name(), 0o666); err != nil {
		t.Fatal(err)
	}
	command := "(echo changed >> " + readOnly.Name() + ") 2>&1 | grep -o 'Read-only file system' | sed 's/^/append: /'"

	s := landlockSpec(t, "/sh "+command)
	s.Policy = isolation.HostPolicy(isolation.FileAccess{AllowRead: []string{readOnly.Name()}}, s.Workspace, nil)
	res, err := hostrun.Runner{}.Run(context.Background(), s)
	if err != nil {
		t.Fatalf("run failed: %v\nstderr: %s", err, res.Stderr)
	}
	if got := lineOf(res.Response.Reply, "append:"); got != "append: Read-only file system" {
		t.Errorf("a root scheduler's run: %q, want read-only\nreply:\n%s", got, res.Response.Reply)
	}

	out := runAsNobody(t, "", "HELPER_AGENT="+berthAgent, "HELPER_ALLOW_READ="+readOnly.Name(), "HELPER_TEXT=/sh "+command)
	if out.Reason == "" {
		if got := lineOf(out.Reply, "append:"); got != "append: Read-only file system" {
			t.Errorf("a non-root scheduler's run: %q, want read-only\nreply:\n%s", got, out.Reply)
		}
	} else if out.Reason != isolation.ReasonConfinement {
		t.Errorf("a non-root scheduler's run: got %q (%s), want a run or a confinement failure", out.Reason, out.Error)
	}
	if data, _ := os.ReadFile(readOnly.Name()); string(data) != "as it was\n" {
		t.Errorf("the read-only file was written: %q", data)
	}
}

// The tools of a confined run keep their temporary files in the run's own
// /tmp (gone with the run), not in the workspace the next run sees; an
// unrestricted run shares the host's /tmp and keeps them in <workspace>/.tmp.
func TestToolsOfAConfinedRunPutTheirTemporaryFilesInItsOwnTmp(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	const command = "echo TMPDIR=$TMPDIR; echo made $(mktemp)"
	confined := toolRun(t, false, command)
	if got := lineOf(confined, "TMPDIR="); got != "TMPDIR=/tmp" {
		t.Errorf("confined run: %q, want TMPDIR=/tmp\nreply:\n%s", got, confined)
	}
	if got := lineOf(confined, "made "); !strings.HasPrefix(got, "made /tmp/tmp.") {
		t.Errorf("confined run: %q, want a file made in /tmp\nreply:\n%s", got, confined)
	}
	unrestricted := toolRun(t, true, command)
	if got := lineOf(unrestricted, "TMPDIR="); !strings.HasSuffix(got, "/.tmp") || got == "TMPDIR=/tmp" {
		t.Errorf("unrestricted run: %q, want TMPDIR=<workspace>/.tmp\nreply:\n%s", got, unrestricted)
	}
}
