package images

import (
	"testing"

	"github.com/godbus/dbus/v5/prop"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/testkit/testbus"
)

func TestAPropertyChangeAfterTheBusIsGoneDoesNotPanic(t *testing.T) {
	t.Parallel()
	conn := testbus.Start(t, testbus.Options{}).Conn(t)
	props, err := prop.Export(conn, bus.ImagesPath, prop.Map{bus.ImagesInterface: {
		"Building": {Value: uint32(0), Emit: prop.EmitFalse},
	}})
	if err != nil {
		t.Fatal(err)
	}
	setProperty(conn, props, bus.ImagesPath, bus.ImagesInterface, "Building", uint32(1))
	// The daemon stopping while a build still reports: the connection is
	// closed, the value is still kept.
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	setProperty(conn, props, bus.ImagesPath, bus.ImagesInterface, "Building", uint32(2))
	if v, derr := props.Get(bus.ImagesInterface, "Building"); derr != nil || v.Value() != uint32(2) {
		t.Fatalf("Building = %v (%v), want 2", v, derr)
	}
}
