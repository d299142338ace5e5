package hostrun

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/mountinfo"
)

// Without systemd a host run still gets a cgroup of its own where one is
// writable (ADR 13): <the scheduler's own cgroup>/berth-runs/<run id>-<attempt>.<pid>,
// with the memory (no swap), pids and CPU limits of the plan. The agent's
// pid is written into it before it gets its request, so every process of
// the run is born inside it; the run's end kills what is left in it and
// removes it. cgroup v2 and v1 are both supported; on a hybrid host (v1
// controllers and an empty v2 hierarchy) v1 is used, since it has the
// controllers.
//
// cgroup_v1.go and cgroup_v2.go hold what differs; this file finds the
// hierarchies and does what both share.

// runsCgroup holds the run cgroups, a child of the scheduler's own. A
// variable only so a test can use a cgroup of its own: on cgroup v1 the
// cpu hierarchy's berth-runs may be the whole host's, shared with every
// other test binary making runs at the same time.
var runsCgroup = "berth-runs"

const (
	// schedulerLeaf is where a cgroup v2 scheduler moves itself when its own
	// cgroup must become an inner node (v2 lets only leaves hold processes).
	schedulerLeaf = "berth-scheduler"
	// cpuPeriod is the CPU quota's period in microseconds.
	cpuPeriod = 100_000
)

// cgroupsUnder, when set, limits the cgroup mounts considered to those
// under it: a test seam that can only take choices away, that is only make
// runs fall back or fail closed.
var cgroupsUnder string

// mountinfoPath and selfCgroupPath are read to find the hierarchies; the
// mounts are those of the calling thread, which may be in a run's mount
// namespace.
const (
	mountinfoPath  = mountinfo.Self
	selfCgroupPath = "/proc/self/cgroup"
)

// cgroupHost is where this process can make run cgroups, as a read-only
// probe found it.
type cgroupHost struct {
	version int // 1 or 2
	// v1: one parent per controller (memory and pids, cpu when mounted);
	// v2: one parent, controller "".
	parents []cgroupParent
	// swap: memory.memsw.limit_in_bytes (v1) or memory.swap.max (v2)
	// exists, so swap can be limited to nothing.
	swap bool
	// noCPU says why the CPU quota cannot be set ("" when it can).
	noCPU string
}

// cgroupParent is one hierarchy's berth-runs cgroup.
type cgroupParent struct {
	// controllers are the v1 controllers of the hierarchy (nil on v2).
	controllers []string
	// base is the scheduler's own cgroup directory (v2: the parent of
	// schedulerLeaf when the scheduler moved itself there).
	base string
	// rel is base as /proc/<pid>/cgroup writes it.
	rel string
}

func (p cgroupParent) dir() string { return filepath.Join(p.base, runsCgroup) }

// has reports whether the hierarchy carries controller c (all do on v2).
func (p cgroupParent) has(c string) bool {
	return p.controllers == nil || slices.Contains(p.controllers, c)
}

// probed is the last probe that found cgroups, for probeCgroupsOnce.
var probed struct {
	sync.Mutex
	host *cgroupHost
}

// probeCgroupsOnce is probeCgroups for a run: where cgroups were found they
// stay found (the probe reads two /proc files, which every run paid for
// before), until a run fails to make its cgroup there (forgetCgroups). A
// probe that found none is not kept, so cgroups mounted later are used by
// the next run.
func probeCgroupsOnce() (cgroupHost, error) {
	probed.Lock()
	if probed.host != nil {
		host := *probed.host
		probed.Unlock()
		return host, nil
	}
	probed.Unlock()
	host, err := probeCgroups()
	if err != nil {
		return host, err
	}
	probed.Lock()
	probed.host = &host
	probed.Unlock()
	return host, nil
}

// forgetCgroups makes the next run probe again.
func forgetCgroups() {
	probed.Lock()
	probed.host = nil
	probed.Unlock()
}

// probeCgroups finds where run cgroups can be made, touching nothing. The
// error names what is missing.
func probeCgroups() (cgroupHost, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return cgroupHost{}, err
	}
	member, err := selfCgroups()
	if err != nil {
		return cgroupHost{}, err
	}
	if slices.ContainsFunc(mounts, func(m mountinfo.Mount) bool { return m.FSType == "cgroup" && slices.Contains(m.Super, "memory") }) {
		return probeV1(mounts, member)
	}
	if i := slices.IndexFunc(mounts, func(m mountinfo.Mount) bool { return m.FSType == "cgroup2" }); i >= 0 {
		return probeV2(mounts[i], member)
	}
	return cgroupHost{}, errors.New("no cgroup filesystem with a memory controller is mounted")
}

// cgroupMounts lists the cgroup and cgroup2 mounts (under cgroupsUnder);
// a v1 mount's super options are its controllers.
func cgroupMounts() ([]mountinfo.Mount, error) {
	all, err := mountinfo.Read(mountinfoPath)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(m mountinfo.Mount) bool {
		return m.FSType != "cgroup" && m.FSType != "cgroup2" || cgroupsUnder != "" && !within(m.Point, cgroupsUnder)
	}), nil
}

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	p, dir = filepath.Clean(p), filepath.Clean(dir)
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// selfCgroups maps each controller of /proc/self/cgroup (and "" for v2) to
// this process's cgroup path.
func selfCgroups() (map[string]string, error) {
	data, err := os.ReadFile(selfCgroupPath)
	if err != nil {
		return nil, fmt.Errorf("cannot read this process's cgroups: %w", err)
	}
	return parseCgroupFile(data), nil
}

func parseCgroupFile(data []byte) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		// hierarchy-id:controller-list:path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out
}

// ownDir is the directory of this process's cgroup path rel in m, or an
// error when m does not show it (a cgroup namespace or bind mount that
// hides it).
func ownDir(m mountinfo.Mount, rel string) (string, error) {
	if rel == "" {
		return "", fmt.Errorf("this process is in no cgroup of %s", m.Point)
	}
	if !within(rel, m.Root) {
		return "", fmt.Errorf("this process's cgroup %s is not visible under %s (mounted from %s)", rel, m.Point, m.Root)
	}
	sub := strings.TrimPrefix(path.Clean(rel), path.Clean(m.Root))
	return filepath.Join(m.Point, sub), nil
}

// isCgroupFS reports whether dir is on a cgroup filesystem of the version.
func isCgroupFS(dir string, version int) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("cannot read %s: %w", dir, err)
	}
	want := int64(unix.CGROUP_SUPER_MAGIC)
	if version == 2 {
		want = unix.CGROUP2_SUPER_MAGIC
	}
	if int64(st.Type) != want {
		return fmt.Errorf("%s is not a cgroup v%d filesystem", dir, version)
	}
	return nil
}

// writable reports whether this process may make cgroups in p: in
// berth-runs when it exists, else in the scheduler's own cgroup.
func writable(p cgroupParent) error {
	dir := p.dir()
	if _, err := os.Stat(dir); err != nil {
		dir = p.base
	}
	if err := unix.Access(dir, unix.W_OK); err != nil {
		return fmt.Errorf("cgroup %s is not writable: %w", dir, err)
	}
	return nil
}

// exists reports whether a cgroup interface file is there.
func exists(name string) bool {
	_, err := os.Stat(name)
	return err == nil
}

// writeCgroup writes one value to a cgroup interface file.
func writeCgroup(dir, file, value string) error {
	f, err := os.OpenFile(filepath.Join(dir, file), os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("cannot set %s: %w", file, err)
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cannot set %s of %s to %s: %w", file, dir, value, err)
	}
	return nil
}

// readKey reads "key N" from a flat-keyed cgroup file (memory.events,
// memory.oom_control, pids.events); ok is false when the key is not there.
func readKey(name, key string) (n uint64, ok bool) {
	data, err := os.ReadFile(name)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, found := strings.Cut(line, " ")
		if found && k == key {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// procsOf lists the pids in a cgroup's cgroup.procs.
func procsOf(dir string) ([]int, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range bytes.Fields(data) {
		if pid, err := strconv.Atoi(string(f)); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// cgroupName is the run cgroup's name: the run id, kept to safe characters,
// and the pid of the scheduler that made it, which tells a left-over of a
// scheduler that is gone from a cgroup a live one is still setting up.
func cgroupName(runID string, pid int) string {
	clean := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, runID)
	if len(clean) > 200 {
		clean = clean[:200]
	}
	if clean == "" {
		clean = "run"
	}
	return clean + "." + strconv.Itoa(pid)
}

// ownerOf is the scheduler pid in a run cgroup's name, 0 when there is none.
func ownerOf(name string) int {
	i := strings.LastIndexByte(name, '.')
	if i < 0 {
		return 0
	}
	pid, err := strconv.Atoi(name[i+1:])
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// alive reports whether a process with pid exists (in this pid namespace)
// and has not ended: a SIGKILLed scheduler stays a zombie until whoever
// started it (dbus-daemon) reaps it, and its leftovers are leftovers then.
func alive(pid int) bool {
	if err := unix.Kill(pid, 0); err != nil && !errors.Is(err, unix.EPERM) {
		return false
	}
	_, _, state, err := sessionAndStart(pid)
	return err != nil || state != 'Z'
}
