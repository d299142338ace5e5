package hostrun

import (
	"os"
	"path/filepath"
	"testing"
)

// OnlyCgroupsUnder makes this process consider only the cgroup mounts under
// dir until t ends: runs can then only fall back to rlimits or fail closed.
// It changes the whole package, so tests that use it must not be parallel.
// The probe kept for runs is forgotten both ways.
func OnlyCgroupsUnder(t testing.TB, dir string) {
	t.Helper()
	old := cgroupsUnder
	cgroupsUnder = dir
	forgetCgroups()
	t.Cleanup(func() { cgroupsUnder = old; forgetCgroups() })
}

// RunCgroups are the cgroup directories a run of runID started by this
// process gets, and the cgroup version; nil and 0 when no cgroup can be made.
func RunCgroups(runID string) ([]string, int) {
	host, err := probeCgroups()
	if err != nil {
		return nil, 0
	}
	var dirs []string
	for _, p := range host.parents {
		dirs = append(dirs, filepath.Join(p.dir(), cgroupName(runID, os.Getpid())))
	}
	return dirs, host.version
}
