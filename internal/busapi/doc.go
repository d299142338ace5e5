// Package busapi is the one typed contract between berth's services and
// their clients on D-Bus: the values that cross the bus (Submission, Reply,
// Run, RunSummary, ListFilter, ProviderResult, Image, Progress, …), each with
// its one encoding to and from the wire, and typed clients of
// dev.berth.Scheduler1, dev.berth.Intake1 and dev.berth.Images1.
//
// The interface XML in units/dbus stays the contract: the wire types are the
// a{ss} and a{sv} dictionaries it names, so older clients and services keep
// working. A caller never indexes a dictionary by a string key or names a
// D-Bus method as a string; that happens here and in the daemons' export
// glue only.
package busapi
