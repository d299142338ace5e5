package scheduler

import (
	"time"

	"github.com/godbus/dbus/v5"
)

// Usage, GetBudgets and SetBudget are for root and berth-admin only: what
// an agent spends is the admin's business, and only an admin raises it.
func (o *schedulerObject) Usage(sender dbus.Sender, agent string, sinceUsec uint64) ([]map[string]dbus.Variant, *dbus.Error) {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return nil, derr
	}
	var since time.Time
	if sinceUsec > 0 {
		since = time.UnixMicro(int64(sinceUsec))
	}
	days, err := o.s.UsageDays(agent, since)
	if err != nil {
		return nil, dbusError(err)
	}
	out := make([]map[string]dbus.Variant, 0, len(days))
	for _, d := range days {
		out = append(out, d.Wire())
	}
	return out, nil
}

func (o *schedulerObject) GetBudgets(sender dbus.Sender, agent string) ([]map[string]dbus.Variant, *dbus.Error) {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return nil, derr
	}
	list, err := o.s.Budgets(agent)
	if err != nil {
		return nil, dbusError(err)
	}
	out := make([]map[string]dbus.Variant, 0, len(list))
	for _, b := range list {
		out = append(out, b.Wire())
	}
	return out, nil
}

func (o *schedulerObject) SetBudget(sender dbus.Sender, agent, key, value string) *dbus.Error {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return derr
	}
	if err := o.s.SetBudget(agent, key, value); err != nil {
		return dbusError(err)
	}
	return nil
}

// runUsageJSON is r's usage as GetRun carries it.
func runUsageJSON(r Run) string {
	if r.Usage == nil {
		return "null"
	}
	return usageWire(*r.Usage).Wire()
}
