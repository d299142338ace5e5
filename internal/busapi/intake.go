package busapi

import (
	"context"
	"fmt"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
)

// Intake is a client of dev.berth.Intake1. Deliver may start intake by
// D-Bus activation.
type Intake struct {
	conn *dbus.Conn
}

// NewIntake is a client of intake on conn.
func NewIntake(conn *dbus.Conn) Intake { return Intake{conn: conn} }

// Deliver hands a finished run's reply to intake; it returns once intake
// has stored it. A reply with Files goes through DeliverFiles.
func (i Intake) Deliver(ctx context.Context, r Reply) error {
	if len(r.Files) > 0 {
		return i.DeliverFiles(ctx, r)
	}
	return call(ctx, i.conn.Object(bus.IntakeName, bus.IntakePath), 0, bus.IntakeInterface, "Deliver", []any{r.Wire()})
}

// DeliverFiles hands a finished run's reply with its files to intake; it
// returns once intake has stored the reply and a copy of every file. The
// files stay the caller's to close.
func (i Intake) DeliverFiles(ctx context.Context, r Reply) error {
	if len(r.Files) > MaxFiles {
		return fmt.Errorf("%w: %d files, at most %d", ErrInvalid, len(r.Files), MaxFiles)
	}
	return call(ctx, i.conn.Object(bus.IntakeName, bus.IntakePath), 0, bus.IntakeInterface, "DeliverFiles", []any{r.Wire(), FilesWire(r.Files)})
}

// ConnectorStatus is one entry of intake's Connectors property.
type ConnectorStatus struct {
	ID             string
	Type           string // webhook | meepachat | discord | slack
	State          string // connecting | connected | disconnected | http | stopped
	ConnectedSince string // RFC 3339 UTC, "" when never
	LastEvent      string
	LastError      string
	LastErrorAt    string
	Reconnects     uint32
	Warning        string
	Progress       string // edit | typing | off; "" for a webhook
	Reactions      string // off | on | why the platform refuses them
}

// Wire is c as the Connectors property holds it (a{sv}).
func (c ConnectorStatus) Wire() map[string]dbus.Variant {
	return map[string]dbus.Variant{
		"id":              dbus.MakeVariant(c.ID),
		"type":            dbus.MakeVariant(c.Type),
		"state":           dbus.MakeVariant(c.State),
		"connected_since": dbus.MakeVariant(c.ConnectedSince),
		"last_event":      dbus.MakeVariant(c.LastEvent),
		"last_error":      dbus.MakeVariant(c.LastError),
		"last_error_at":   dbus.MakeVariant(c.LastErrorAt),
		"reconnects":      dbus.MakeVariant(c.Reconnects),
		"warning":         dbus.MakeVariant(c.Warning),
		"progress":        dbus.MakeVariant(c.Progress),
		"reactions":       dbus.MakeVariant(c.Reactions),
	}
}

// ConnectorsFromWire reads the Connectors property.
func ConnectorsFromWire(v dbus.Variant) ([]ConnectorStatus, error) {
	list, ok := v.Value().([]map[string]dbus.Variant)
	if !ok {
		return nil, fmt.Errorf("%w: Connectors has type %s, want aa{sv}", ErrInvalid, v.Signature())
	}
	out := make([]ConnectorStatus, 0, len(list))
	for _, m := range list {
		var c ConnectorStatus
		f := fields{m: m}
		f.str("id", &c.ID)
		f.str("type", &c.Type)
		f.str("state", &c.State)
		f.str("connected_since", &c.ConnectedSince)
		f.str("last_event", &c.LastEvent)
		f.str("last_error", &c.LastError)
		f.str("last_error_at", &c.LastErrorAt)
		f.u32("reconnects", &c.Reconnects)
		f.str("warning", &c.Warning)
		f.str("progress", &c.Progress)
		f.str("reactions", &c.Reactions)
		if f.err != nil {
			return nil, fmt.Errorf("cannot read connector status: %w", f.err)
		}
		out = append(out, c)
	}
	return out, nil
}

// IntakeStatus holds intake's properties.
type IntakeStatus struct {
	InboxPending  uint32
	OutboxPending uint32
	Connectors    []ConnectorStatus
}

// Properties reads intake's properties without starting it.
func (i Intake) Properties(ctx context.Context) (IntakeStatus, error) {
	props, err := getAll(ctx, i.conn.Object(bus.IntakeName, bus.IntakePath), bus.IntakeInterface)
	if err != nil {
		return IntakeStatus{}, err
	}
	var st IntakeStatus
	f := fields{m: props}
	f.u32("InboxPending", &st.InboxPending)
	f.u32("OutboxPending", &st.OutboxPending)
	if f.err != nil {
		return IntakeStatus{}, f.err
	}
	if v, ok := props["Connectors"]; ok {
		if st.Connectors, err = ConnectorsFromWire(v); err != nil {
			return IntakeStatus{}, err
		}
	}
	return st, nil
}
