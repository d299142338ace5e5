// Package bus holds berth's D-Bus names and the plumbing every service and
// client shares: connecting to the system bus (or the one DBUS_SYSTEM_BUS_ADDRESS
// names), typed errors, and the caller credential check behind every
// state-changing method.
package bus

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strconv"

	"github.com/godbus/dbus/v5"
)

// Well-known names, object paths and interfaces.
const (
	SchedulerName      = "dev.berth.Scheduler1"
	SchedulerPath      = dbus.ObjectPath("/dev/berth/Scheduler1")
	SchedulerInterface = "dev.berth.Scheduler1"

	IntakeName      = "dev.berth.Intake1"
	IntakePath      = dbus.ObjectPath("/dev/berth/Intake1")
	IntakeInterface = "dev.berth.Intake1"

	ImagesName         = "dev.berth.Images1"
	ImagesPath         = dbus.ObjectPath("/dev/berth/Images1")
	ImagesInterface    = "dev.berth.Images1"
	ImagesJobInterface = "dev.berth.Images1.Job"

	// AdminGroup may call state-changing methods besides root.
	AdminGroup = "berth-admin"
)

// RunPath is the object path of one run.
func RunPath(runID string) dbus.ObjectPath {
	return dbus.ObjectPath(string(SchedulerPath) + "/run/" + runID)
}

// ImagesJobPath is the object path of one image build job.
func ImagesJobPath(id string) dbus.ObjectPath {
	return dbus.ObjectPath(string(ImagesPath) + "/job/" + id)
}

// Error names: dev.berth.Error.<Kind>.
const (
	ErrNotFound        = "dev.berth.Error.NotFound"
	ErrInvalidArgument = "dev.berth.Error.InvalidArgument"
	ErrAccessDenied    = "dev.berth.Error.AccessDenied"
	ErrUnavailable     = "dev.berth.Error.Unavailable"
	ErrInternal        = "dev.berth.Error.Internal"
)

// NewError builds a D-Bus error reply with a human-readable message.
func NewError(name, format string, args ...any) *dbus.Error {
	return dbus.NewError(name, []any{fmt.Sprintf(format, args...)})
}

// ErrorName returns the D-Bus error name carried by err, or "".
func ErrorName(err error) string {
	var de dbus.Error
	if errors.As(err, &de) {
		return de.Name
	}
	var dep *dbus.Error
	if errors.As(err, &dep) {
		return dep.Name
	}
	return ""
}

// ConnectSystem connects to the system bus, or to DBUS_SYSTEM_BUS_ADDRESS when
// set (tests and the quickstart use a private bus that way). It returns a
// private connection: callers Close it.
func ConnectSystem() (*dbus.Conn, error) {
	addr := os.Getenv("DBUS_SYSTEM_BUS_ADDRESS")
	if addr == "" {
		addr = "unix:path=/run/dbus/system_bus_socket"
	}
	conn, err := dbus.Connect(addr)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to the system bus at %s: %w", addr, err)
	}
	return conn, nil
}

// Caller is who sent a method call, as the bus daemon (not the caller) says.
type Caller struct {
	UID uint32
}

// CallerOf asks the bus daemon for the Unix uid behind a sender's unique name.
func CallerOf(conn *dbus.Conn, sender dbus.Sender) (Caller, error) {
	var uid uint32
	err := conn.BusObject().Call("org.freedesktop.DBus.GetConnectionUnixUser", 0, string(sender)).Store(&uid)
	if err != nil {
		return Caller{}, fmt.Errorf("cannot get credentials of %s: %w", sender, err)
	}
	return Caller{UID: uid}, nil
}

// Authorizer decides who may call state-changing methods: root, the process's
// own uid (the service user), members of AdminGroup, and any extra users named.
type Authorizer struct {
	ExtraUsers []string
}

// Check returns a dev.berth.Error.AccessDenied error unless the sender may
// change state.
func (a Authorizer) Check(conn *dbus.Conn, sender dbus.Sender) *dbus.Error {
	c, err := CallerOf(conn, sender)
	if err != nil {
		return NewError(ErrAccessDenied, "%v", err)
	}
	if c.UID == 0 || c.UID == uint32(os.Getuid()) {
		return nil
	}
	u, err := user.LookupId(strconv.FormatUint(uint64(c.UID), 10))
	if err != nil {
		return NewError(ErrAccessDenied, "uid %d is not allowed to change berth state", c.UID)
	}
	if slices.Contains(a.ExtraUsers, u.Username) {
		return nil
	}
	if g, err := user.LookupGroup(AdminGroup); err == nil {
		if gids, err := u.GroupIds(); err == nil && slices.Contains(gids, g.Gid) {
			return nil
		}
	}
	return NewError(ErrAccessDenied, "user %s is not root and not in group %s", u.Username, AdminGroup)
}
