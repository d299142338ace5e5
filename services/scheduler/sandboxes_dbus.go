package scheduler

import (
	"context"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/busapi"
)

// listSandboxesTimeout bounds ListSandboxes' memory readings (a container's
// asks the engine).
const listSandboxesTimeout = 10 * time.Second

// ListSandboxes and StopSandbox are for root and berth-admin only (not the
// intake user): a sandbox's conversation is as private as its runs.
func (o *schedulerObject) ListSandboxes(sender dbus.Sender, agent string) ([]map[string]dbus.Variant, *dbus.Error) {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return nil, derr
	}
	ctx, cancel := context.WithTimeout(context.Background(), listSandboxesTimeout)
	defer cancel()
	list := o.s.ListSandboxes(ctx, agent)
	out := make([]map[string]dbus.Variant, 0, len(list))
	for _, sb := range list {
		out = append(out, sb.bus().Wire())
	}
	return out, nil
}

func (o *schedulerObject) StopSandbox(sender dbus.Sender, id string) *dbus.Error {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return derr
	}
	if err := o.s.StopSandbox(id); err != nil {
		return dbusError(err)
	}
	return nil
}

// bus is the sandbox as busapi types it.
func (i SandboxInfo) bus() busapi.Sandbox {
	return busapi.Sandbox{ID: i.ID, Agent: i.Agent, Connector: i.Connector, Channel: i.Channel, Thread: i.Thread,
		Backend: i.Backend, Started: i.StartedAt, LastActivity: i.LastActivity, IdleFor: i.IdleFor, Busy: i.Busy,
		Runs: uint32(i.Runs), MemoryBytes: i.MemoryBytes, MemoryUnknown: i.MemoryUnknown}
}
