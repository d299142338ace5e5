package kube

import "testing"

// OnProbeCreated calls f with each probe pod once created, until t ends.
func OnProbeCreated(t testing.TB, f func(ns, name string)) {
	probeCreated.Store(&f)
	t.Cleanup(func() { probeCreated.Store(nil) })
}
