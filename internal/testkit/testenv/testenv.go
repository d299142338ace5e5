// Package testenv decides what a test does when a real component it needs
// (root, Landlock, dbus-daemon, Docker) is missing: under CI=true it fails —
// CI must never pass by skipping — and on a developer machine it skips.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Need fails (CI=true) or skips (elsewhere) the test unless ok.
func Need(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if ok {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI=true: a missing component fails the test)", msg)
	}
	t.Skip(msg + " (skipped outside CI)")
}

// NeedRoot needs euid 0: the test switches users or creates namespaces.
func NeedRoot(t testing.TB) {
	t.Helper()
	Need(t, os.Geteuid() == 0, "this test needs root")
}

// OpenDir creates a temporary directory every user can enter (t.TempDir's
// parent is 0700): agents that run as nobody must reach binaries and
// workspaces in it. The caller removes it.
func OpenDir(prefix string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", fmt.Errorf("cannot create test dir: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("cannot open test dir: %w", err)
	}
	return dir, nil
}

// Build compiles pkg (an import path, or a path relative to the test's
// package directory) to dir/name and returns the binary's path.
func Build(dir, name, pkg string) (string, error) { return build(dir, name, pkg, nil) }

// BuildStatic is Build with CGO_ENABLED=0, as berth-agent ships: the binary
// also runs in the agent's container image (no dynamic loader), and changing
// every thread's capabilities works only without cgo.
func BuildStatic(dir, name, pkg string) (string, error) {
	return build(dir, name, pkg, []string{"CGO_ENABLED=0"})
}

func build(dir, name, pkg string, env []string) (string, error) {
	bin := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("cannot build %s: %v\n%s", pkg, err, out)
	}
	return bin, nil
}
