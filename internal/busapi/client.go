package busapi

import (
	"context"
	"time"

	"github.com/godbus/dbus/v5"
)

// DefaultCallTimeout bounds a call whose context has no deadline of its
// own, so that no client call waits forever for a service that hangs.
const DefaultCallTimeout = 30 * time.Second

// callContext is ctx with DefaultCallTimeout when it has no deadline.
func callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, DefaultCallTimeout)
}

// call makes one method call of iface on obj and stores its results.
func call(ctx context.Context, obj dbus.BusObject, flags dbus.Flags, iface, method string, args []any, results ...any) error {
	ctx, cancel := callContext(ctx)
	defer cancel()
	c := obj.CallWithContext(ctx, iface+"."+method, flags, args...)
	if c.Err != nil {
		return c.Err
	}
	if len(results) == 0 {
		return nil
	}
	return c.Store(results...)
}

// getAll reads every property of iface on obj without starting its service:
// asking how a service is must not start it.
func getAll(ctx context.Context, obj dbus.BusObject, iface string) (map[string]dbus.Variant, error) {
	var props map[string]dbus.Variant
	err := call(ctx, obj, dbus.FlagNoAutoStart, "org.freedesktop.DBus.Properties", "GetAll", []any{iface}, &props)
	return props, err
}

// Activatable lists the names the bus can start a service for (D-Bus
// activation), so that a caller can tell "not running" from "starts on
// demand".
func Activatable(ctx context.Context, conn *dbus.Conn) ([]string, error) {
	var names []string
	err := call(ctx, conn.BusObject(), 0, "org.freedesktop.DBus", "ListActivatableNames", nil, &names)
	return names, err
}

// getProperty reads one property of iface on obj into dst.
func getProperty(ctx context.Context, obj dbus.BusObject, iface, name string, dst any) error {
	var v dbus.Variant
	if err := call(ctx, obj, 0, "org.freedesktop.DBus.Properties", "Get", []any{iface, name}, &v); err != nil {
		return err
	}
	return dbus.Store([]any{v.Value()}, dst)
}
