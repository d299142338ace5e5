// Package units ships berth's systemd units, D-Bus policy, activation files and
// interface XML exactly as they are installed. Go code embeds the interface
// XML from here so `busctl introspect` shows the very file we install.
package units

import _ "embed"

// SchedulerXML is the introspection data of dev.berth.Scheduler1.
//
//go:embed dbus/dev.berth.Scheduler1.xml
var SchedulerXML string

// IntakeXML is the introspection data of dev.berth.Intake1.
//
//go:embed dbus/dev.berth.Intake1.xml
var IntakeXML string

// ImagesXML is the introspection data of dev.berth.Images1.
//
//go:embed dbus/dev.berth.Images1.xml
var ImagesXML string

// MetricsXML is the introspection data of dev.berth.Metrics1, which every
// daemon serves on its own object beside its main interface.
//
//go:embed dbus/dev.berth.Metrics1.xml
var MetricsXML string
