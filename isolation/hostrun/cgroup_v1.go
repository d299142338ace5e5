package hostrun

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/berth-dev/berth/internal/mountinfo"
)

// cgroup v1 keeps each controller in a hierarchy of its own, so a run has
// one cgroup per hierarchy (memory, pids, cpu), each a child of the
// scheduler's own cgroup in that hierarchy. Swap is off when the kernel
// accounts it (memory.memsw.limit_in_bytes); v1 has no cgroup.kill, so the
// run's processes are killed one by one, with pids.max at 0 so none forks.

// probeV1 finds the memory and pids hierarchies (both needed) and cpu
// (used when there).
func probeV1(mounts []mountinfo.Mount, member map[string]string) (cgroupHost, error) {
	host := cgroupHost{version: 1}
	for _, c := range []string{"memory", "pids", "cpu"} {
		p, err := v1Parent(mounts, c, member)
		if err != nil {
			if c == "cpu" {
				host.noCPU = err.Error()
				continue
			}
			return cgroupHost{}, err
		}
		if j := slices.IndexFunc(host.parents, func(q cgroupParent) bool { return q.base == p.base }); j >= 0 {
			host.parents[j].controllers = append(host.parents[j].controllers, c)
			continue
		}
		host.parents = append(host.parents, p)
	}
	mem := host.parents[0]
	host.swap = exists(filepath.Join(mem.base, "memory.memsw.limit_in_bytes"))
	return host, nil
}

// v1Parent is the hierarchy of controller c.
func v1Parent(mounts []mountinfo.Mount, c string, member map[string]string) (cgroupParent, error) {
	i := slices.IndexFunc(mounts, func(m mountinfo.Mount) bool { return m.FSType == "cgroup" && slices.Contains(m.Super, c) })
	if i < 0 {
		return cgroupParent{}, fmt.Errorf("no cgroup v1 %s hierarchy is mounted", c)
	}
	rel := member[c]
	own, err := ownDir(mounts[i], rel)
	if err != nil {
		return cgroupParent{}, err
	}
	if err := isCgroupFS(own, 1); err != nil {
		return cgroupParent{}, err
	}
	p := cgroupParent{controllers: []string{c}, base: own, rel: rel}
	if err := writable(p); err != nil {
		return cgroupParent{}, err
	}
	return p, nil
}

// v1Files are the interface files a v1 run cgroup of parent p gets, in the
// order they are written (memory.limit_in_bytes before memsw, which may
// never be below it).
func v1Files(host cgroupHost, p cgroupParent, lim Limits) [][2]string {
	var files [][2]string
	if p.has("memory") {
		files = append(files, [2]string{"memory.limit_in_bytes", strconv.FormatUint(lim.MemoryMax, 10)})
		if host.swap {
			files = append(files, [2]string{"memory.memsw.limit_in_bytes", strconv.FormatUint(lim.MemoryMax, 10)})
		} else {
			files = append(files, [2]string{"memory.swappiness", "0"})
		}
	}
	if p.has("pids") {
		files = append(files, [2]string{"pids.max", strconv.FormatUint(lim.TasksMax, 10)})
	}
	if p.has("cpu") && host.noCPU == "" {
		files = append(files,
			[2]string{"cpu.cfs_period_us", strconv.Itoa(cpuPeriod)},
			[2]string{"cpu.cfs_quota_us", strconv.FormatUint(lim.CPUQuotaPercent*cpuPeriod/100, 10)})
	}
	return files
}
