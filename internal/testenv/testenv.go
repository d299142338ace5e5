// Package testenv decides what a test does when a real component it needs
// (root, Landlock, dbus-daemon, Docker) is missing: under CI=true it fails —
// CI must never pass by skipping — and on a developer machine it skips.
package testenv

import (
	"fmt"
	"os"
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
