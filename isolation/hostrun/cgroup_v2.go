package hostrun

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/mountinfo"
)

// cgroup v2 has one hierarchy: a run has one cgroup with memory.max,
// memory.swap.max = 0, pids.max and cpu.max, is ended with cgroup.kill and
// tells an OOM kill in memory.events. v2 lets only leaf cgroups hold
// processes: to make berth-runs a sibling with controllers, a scheduler
// whose own cgroup holds it moves itself into a leaf, berth-scheduler,
// once; runs then go to <own>/berth-runs next to it.

// probeV2 checks that the scheduler's cgroup can hand memory and pids (and
// cpu, when there) to cgroups below it.
func probeV2(m mountinfo.Mount, member map[string]string) (cgroupHost, error) {
	rel, ok := member[""]
	if !ok {
		return cgroupHost{}, errors.New("this process is in no cgroup v2")
	}
	own, err := ownDir(m, rel)
	if err != nil {
		return cgroupHost{}, err
	}
	base, baseRel := own, rel
	if filepath.Base(own) == schedulerLeaf {
		base, baseRel = filepath.Dir(own), path.Dir(rel)
	}
	if err := isCgroupFS(base, 2); err != nil {
		return cgroupHost{}, err
	}
	data, err := os.ReadFile(filepath.Join(base, "cgroup.controllers"))
	if err != nil {
		return cgroupHost{}, fmt.Errorf("cannot read the controllers of %s: %w", base, err)
	}
	have := strings.Fields(string(data))
	for _, c := range []string{"memory", "pids"} {
		if !slices.Contains(have, c) {
			return cgroupHost{}, fmt.Errorf("cgroup v2 %s has no %s controller (its parent does not delegate it)", base, c)
		}
	}
	p := cgroupParent{base: base, rel: baseRel}
	if err := writable(p); err != nil {
		return cgroupHost{}, err
	}
	host := cgroupHost{version: 2, parents: []cgroupParent{p}}
	if !slices.Contains(have, "cpu") {
		host.noCPU = fmt.Sprintf("cgroup v2 %s has no cpu controller", base)
	}
	// The root cgroup has no memory.swap.max of its own; a kernel without
	// swap accounting has none anywhere.
	host.swap = base == m.Point || exists(filepath.Join(base, "memory.swap.max"))
	return host, nil
}

// v2Controllers are the controllers berth-runs and the run cgroups need.
func v2Controllers(host cgroupHost) []string {
	cs := []string{"memory", "pids"}
	if host.noCPU == "" {
		cs = append(cs, "cpu")
	}
	return cs
}

// v2Prepare makes <base>/berth-runs with the controllers enabled for it
// and below it, moving this process into <base>/berth-scheduler when its
// own cgroup holds processes and so cannot hand controllers down.
func v2Prepare(host cgroupHost, p cgroupParent) error {
	cs := v2Controllers(host)
	err := enableControllers(p.base, cs)
	if errors.Is(err, unix.EBUSY) {
		leaf := filepath.Join(p.base, schedulerLeaf)
		if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cannot make the scheduler's own leaf cgroup: %w", err)
		}
		if err := writeCgroup(leaf, "cgroup.procs", strconv.Itoa(os.Getpid())); err != nil {
			return fmt.Errorf("cannot move the scheduler into its leaf cgroup: %w", err)
		}
		err = enableControllers(p.base, cs)
	}
	if err != nil {
		return fmt.Errorf("cannot hand %s down from %s (does it hold processes other than berth-scheduler's?): %w", strings.Join(cs, ", "), p.base, err)
	}
	if err := os.Mkdir(p.dir(), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("cannot make %s: %w", p.dir(), err)
	}
	return enableControllers(p.dir(), cs)
}

// enableControllers adds cs to dir's cgroup.subtree_control unless there.
func enableControllers(dir string, cs []string) error {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("cannot read cgroup.subtree_control of %s: %w", dir, err)
	}
	on := strings.Fields(string(data))
	var add []string
	for _, c := range cs {
		if !slices.Contains(on, c) {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	return writeCgroup(dir, "cgroup.subtree_control", strings.Join(add, " "))
}

// v2Files are the interface files a v2 run cgroup gets.
func v2Files(host cgroupHost, lim Limits) [][2]string {
	files := [][2]string{{"memory.max", strconv.FormatUint(lim.MemoryMax, 10)}}
	if host.swap {
		files = append(files, [2]string{"memory.swap.max", "0"})
	}
	files = append(files, [2]string{"pids.max", strconv.FormatUint(lim.TasksMax, 10)})
	if host.noCPU == "" {
		files = append(files, [2]string{"cpu.max", fmt.Sprintf("%d %d", lim.CPUQuotaPercent*cpuPeriod/100, cpuPeriod)})
	}
	return files
}
