package agent

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/mountinfo"
)

// oomCounter is the kernel's count of OOM kills in the agent's own memory
// cgroup, which its tools share. The engine's "oom" event is sent
// asynchronously and, under load, sometimes never: this count is what lets
// a run whose tool was OOM-killed be reported as out of memory anyway.
//
// The file is opened before Landlock is enforced and read through the open
// descriptor afterwards, so no policy has to allow the cgroup filesystem.
type oomCounter struct {
	file *os.File
	// key is the counter's line: "oom_kill" in v2's memory.events and in
	// v1's memory.oom_control alike.
	key string
}

// Where the agent learns its cgroup and the mounts; variables for tests.
var (
	selfCgroupFile = "/proc/self/cgroup"
	selfMountinfo  = mountinfo.Self
)

// openOOMCounter opens the OOM counter of this process's memory cgroup:
// v1's memory controller when one is mounted, else the v2 hierarchy.
func openOOMCounter() (*oomCounter, error) {
	name, err := oomCounterPath(selfCgroupFile, selfMountinfo)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("cannot open the OOM counter: %w", err)
	}
	c := &oomCounter{file: f, key: "oom_kill"}
	if _, err := c.count(); err != nil {
		f.Close()
		return nil, err
	}
	return c, nil
}

// oomCounterPath finds the file holding the OOM kill count of the cgroup
// named in cgroupFile, through the mounts in mountinfoFile.
func oomCounterPath(cgroupFile, mountinfoFile string) (string, error) {
	data, err := os.ReadFile(cgroupFile)
	if err != nil {
		return "", fmt.Errorf("cannot read this process's cgroups: %w", err)
	}
	mounts, err := mountinfo.Read(mountinfoFile)
	if err != nil {
		return "", err
	}
	member := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		// hierarchy-id:controller-list:path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			member[c] = parts[2]
		}
	}
	if i := slices.IndexFunc(mounts, func(m mountinfo.Mount) bool { return m.FSType == "cgroup" && slices.Contains(m.Super, "memory") }); i >= 0 {
		dir, err := visibleDir(mounts[i], member["memory"])
		return filepath.Join(dir, "memory.oom_control"), err
	}
	if i := slices.IndexFunc(mounts, func(m mountinfo.Mount) bool { return m.FSType == "cgroup2" }); i >= 0 {
		dir, err := visibleDir(mounts[i], member[""])
		return filepath.Join(dir, "memory.events"), err
	}
	return "", errors.New("no cgroup filesystem with a memory controller is mounted")
}

// visibleDir is where cgroup rel shows under mount m (a container's mount
// is rooted at its own cgroup, so "/docker/<id>" shows at the mount point).
func visibleDir(m mountinfo.Mount, rel string) (string, error) {
	rel, root := path.Clean(rel), path.Clean(m.Root)
	if rel == "." {
		return "", fmt.Errorf("this process is in no cgroup of %s", m.Point)
	}
	switch {
	case root == "/":
		return filepath.Join(m.Point, rel), nil
	case rel == root:
		return m.Point, nil
	case strings.HasPrefix(rel, root+"/"):
		return filepath.Join(m.Point, strings.TrimPrefix(rel, root)), nil
	}
	return "", fmt.Errorf("this process's cgroup %s is not visible under %s (mounted from %s)", rel, m.Point, m.Root)
}

// count reads the counter again from the start of the file.
func (c *oomCounter) count() (uint64, error) {
	if _, err := c.file.Seek(0, io.SeekStart); err != nil {
		return 0, fmt.Errorf("cannot read the OOM counter: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(c.file, 64<<10))
	if err != nil {
		return 0, fmt.Errorf("cannot read the OOM counter: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == c.key {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cannot read the OOM counter: %q: %w", line, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("cannot read the OOM counter: %s has no %s line", c.file.Name(), c.key)
}

// since returns how many OOM kills the counter gained over base; 0 when c
// is nil (no counter could be opened) or it cannot be read now.
func (c *oomCounter) since(base uint64) int {
	if c == nil {
		return 0
	}
	n, err := c.count()
	if err != nil || n < base {
		return 0
	}
	return int(n - base)
}

// now is the counter's current value, 0 for a nil counter.
func (c *oomCounter) now() uint64 {
	if c == nil {
		return 0
	}
	n, _ := c.count()
	return n
}

// watchOOM opens the OOM counter, or logs why there is none: the run then
// relies on its backend alone to notice an OOM kill.
func watchOOM(log *slog.Logger) *oomCounter {
	c, err := openOOMCounter()
	if err != nil {
		log.Info("cannot watch the sandbox's OOM kills", "reason", err.Error())
		return nil
	}
	return c
}
