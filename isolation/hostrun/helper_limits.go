package hostrun

import (
	"context"
	"fmt"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/coreos/go-systemd/v22/unit"
)

// HelperPrefix starts the name of each run helper's scope (the run's
// egress proxy: berth-egress-<run id>.scope).
const HelperPrefix = "berth-"

// HelperScopeName is the transient scope of run runID's helper role.
func HelperScopeName(role, runID string) string {
	return HelperPrefix + role + "-" + unit.UnitNameEscape(runID) + ".scope"
}

// Helper is a run helper's limits: its cgroups or its scope.
type Helper struct {
	// Dirs are the cgroup directories made for it, one per hierarchy
	// (none for a scope: systemd makes those).
	Dirs []string
	// Scope is its transient scope under systemd ("" without).
	Scope   string
	release func()
}

// Release removes the helper's cgroups or scope, killing what is left in
// them; call it once the helper has ended.
func (h *Helper) Release() { h.release() }

// ConfineHelper puts pid, a process that serves run runID from outside its
// sandbox (role "egress": the run's proxy), into limits of its own beside
// the run's, so a run that exhausts it starves only itself: under systemd a
// transient scope in berth-runs.slice, else a cgroup in berth-runs. An
// error says the limits cannot hold here; the caller decides whether that
// fails the run (as host runs do by allow_rlimit_fallback).
func ConfineHelper(ctx context.Context, role, runID string, pid int, lim Limits, systemd bool) (*Helper, error) {
	if systemd {
		return helperScope(ctx, role, runID, pid, lim)
	}
	host, err := probeCgroupsOnce()
	if err != nil {
		return nil, fmt.Errorf("cannot limit the run's %s process: no systemd and no writable cgroup: %w", role, err)
	}
	c := newCgroupLimits(host, runID+"-"+role, lim, 0)
	if err := c.prepare(); err != nil {
		c.release()
		return nil, fmt.Errorf("cannot limit the run's %s process: %w", role, err)
	}
	if err := c.started(pid); err != nil {
		c.release()
		return nil, fmt.Errorf("cannot move the run's %s process into its cgroup: %w", role, err)
	}
	return &Helper{Dirs: append([]string(nil), c.made...), release: c.release}, nil
}

// helperScope makes the transient scope that holds pid with lim.
func helperScope(ctx context.Context, role, runID string, pid int, lim Limits) (*Helper, error) {
	name := HelperScopeName(role, runID)
	// Not ctx itself: godbus closes a connection when its context is done,
	// and release still needs this one.
	conn, err := sdbus.NewSystemdConnectionContext(context.WithoutCancel(ctx))
	if err != nil {
		return nil, fmt.Errorf("cannot connect to systemd: %w", err)
	}
	weighSlice(ctx, conn)
	// A scope left by an earlier attempt of this run must not block the name.
	stopUnit(ctx, conn, name)
	props := []sdbus.Property{
		sdbus.PropDescription(fmt.Sprintf("berth run %s: its %s process", runID, role)),
		sdbus.PropSlice(RunsSlice),
		sdbus.PropPids(uint32(pid)),
		prop("CollectMode", "inactive-or-failed"),
		prop("MemoryAccounting", true),
		prop("MemoryMax", lim.MemoryMax),
		prop("MemorySwapMax", uint64(0)),
		prop("TasksAccounting", true),
		prop("TasksMax", lim.TasksMax),
		prop("CPUAccounting", true),
		prop("CPUQuotaPerSecUSec", lim.CPUQuotaPercent*10000),
	}
	done := make(chan string, 1)
	startCtx, cancel := context.WithTimeout(ctx, unitCallTimeout)
	defer cancel()
	if _, err := conn.StartTransientUnitContext(startCtx, name, "fail", props, done); err != nil {
		conn.Close()
		return nil, fmt.Errorf("systemd refused the transient scope %s: %w", name, err)
	}
	select {
	case result := <-done:
		if result != "done" {
			stopUnit(ctx, conn, name)
			conn.Close()
			return nil, fmt.Errorf("cannot start the transient scope %s: its job ended %q", name, result)
		}
	case <-startCtx.Done():
		stopUnit(ctx, conn, name)
		conn.Close()
		return nil, fmt.Errorf("cannot start the transient scope %s: %w", name, startCtx.Err())
	}
	return &Helper{Scope: name, release: func() {
		stopUnit(context.Background(), conn, name)
		conn.Close()
	}}, nil
}
