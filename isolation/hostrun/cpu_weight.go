package hostrun

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
)

// Runs yield the CPU (ADR 30): all host runs together — their egress
// proxies included — get one CPU weight, [scheduler] runs_cpu_weight
// (systemd's CPUWeight scale: 100 is an ordinary service, default 20), on
// the group that holds them: berth-runs.slice under systemd (a property set
// at run time over what units/systemd/berth-runs.slice ships), else the
// berth-runs cgroup (cgroup v2 cpu.weight; v1 cpu.shares, converted as
// systemd does, 1024 per 100). A weight only matters when the CPU is
// contended: an idle machine gives runs all of it. The weight is written
// once per group and value, not per run, so a run pays nothing for it.

const (
	// DefaultRunsCPUWeight is the weight until SetRunsCPUWeight is called;
	// config.DefaultRunsCPUWeight is the same.
	DefaultRunsCPUWeight = 20
	// maxCPUWeight is cgroup v2's and systemd's largest CPU weight.
	maxCPUWeight = 10000
)

// runsWeight is the weight the runs' group gets.
var runsWeight atomic.Uint64

func init() { runsWeight.Store(DefaultRunsCPUWeight) }

// noWeight, when set, makes weighRuns and weighSlice write nothing: a test
// seam, the control that shows the weight test can fail.
var noWeight atomic.Bool

// weighed maps each group (a berth-runs directory, or RunsSlice) to the
// weight last written to it by this process.
var weighed sync.Map

// SetRunsCPUWeight sets the CPU weight of all runs together (1–10000); the
// next run writes it to its group. The scheduler calls it with
// [scheduler] runs_cpu_weight at start and on reload.
func SetRunsCPUWeight(w int) error {
	if w < 1 || w > maxCPUWeight {
		return fmt.Errorf("runs CPU weight %d is not from 1 to %d", w, maxCPUWeight)
	}
	runsWeight.Store(uint64(w))
	return nil
}

// RunsCPUWeight is the weight runs get.
func RunsCPUWeight() int { return int(runsWeight.Load()) }

// v1Shares is weight w as cgroup v1 cpu.shares: systemd's conversion
// (CPUWeight=100 is cpu.shares 1024), at least the kernel's minimum, 2.
func v1Shares(w uint64) uint64 { return max(2, w*1024/100) }

// weightFile is the interface file and value that give parent p's
// berth-runs cgroup weight w; ok is false where it has no cpu controller.
func weightFile(host cgroupHost, p cgroupParent, w uint64) (file, value string, ok bool) {
	if host.noCPU != "" || !p.has("cpu") {
		return "", "", false
	}
	if host.version == 2 {
		return "cpu.weight", strconv.FormatUint(w, 10), true
	}
	return "cpu.shares", strconv.FormatUint(v1Shares(w), 10), true
}

// weighRuns gives p's berth-runs cgroup the runs' weight unless this
// process already did. A weight that cannot be written is logged, not
// fatal: it orders work, it confines nothing.
func weighRuns(host cgroupHost, p cgroupParent) {
	w := runsWeight.Load()
	dir := p.dir()
	if last, ok := weighed.Load(dir); ok && last.(uint64) == w {
		return
	}
	file, value, ok := weightFile(host, p, w)
	if !ok || noWeight.Load() {
		return
	}
	if err := writeCgroup(dir, file, value); err != nil {
		slog.Warn("cannot give the runs their CPU weight: runs compete with intake and the daemons at full weight", "path", filepath.Join(dir, file), "weight", w, "err", err)
	}
	weighed.Store(dir, w)
}

// weighSlice gives RunsSlice the runs' weight (a runtime property, as
// `systemctl set-property --runtime` sets) unless this process already did.
func weighSlice(ctx context.Context, conn *sdbus.Conn) {
	w := runsWeight.Load()
	if last, ok := weighed.Load(RunsSlice); ok && last.(uint64) == w {
		return
	}
	if noWeight.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, unitCallTimeout)
	defer cancel()
	if err := conn.SetUnitPropertiesContext(ctx, RunsSlice, true, sdbus.Property{Name: "CPUWeight", Value: dbus.MakeVariant(w)}); err != nil {
		slog.Warn("cannot give the runs their CPU weight: runs compete with intake and the daemons at "+RunsSlice+"'s weight", "weight", w, "err", err)
	}
	weighed.Store(RunsSlice, w)
}
