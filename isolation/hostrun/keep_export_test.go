package hostrun

import (
	"path/filepath"
	"strings"
	"testing"
)

// KeptCgroupDirs are the cgroup directories a kept sandbox's handle names.
func KeptCgroupDirs(t testing.TB, handle string) []string {
	t.Helper()
	parts := strings.SplitN(strings.TrimPrefix(handle, keptHandlePrefix), ":", 3)
	if len(parts) != 3 || parts[2] == "" {
		return nil
	}
	host, err := probeCgroups()
	if err != nil {
		t.Fatalf("cannot probe cgroups: %v", err)
	}
	var dirs []string
	for _, p := range host.parents {
		dirs = append(dirs, filepath.Join(p.dir(), parts[2]))
	}
	return dirs
}
