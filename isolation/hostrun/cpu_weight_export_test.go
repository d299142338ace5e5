package hostrun

import (
	"os"
	"strconv"
	"testing"
)

// WithRunsCPUWeight sets the runs' CPU weight until t ends, and whether it
// is written at all (write false: the control, as if the write were
// removed). What this process wrote before is forgotten both ways, so the
// next run writes again. Not for parallel tests.
func WithRunsCPUWeight(t testing.TB, w int, write bool) {
	t.Helper()
	withPrivateRunsCgroup(t)
	old := RunsCPUWeight()
	if err := SetRunsCPUWeight(w); err != nil {
		t.Fatal(err)
	}
	noWeight.Store(!write)
	weighed.Clear()
	t.Cleanup(func() {
		_ = SetRunsCPUWeight(old)
		noWeight.Store(false)
		weighed.Clear()
	})
}

// RunsCPUFile is the interface file of the berth-runs cgroup that holds its
// CPU weight (cpu.shares on v1, cpu.weight on v2), and the value weight w
// is written as; "" where runs get no cgroup or it has no cpu controller.
func RunsCPUFile(w int) (file, value string) {
	host, err := probeCgroups()
	if err != nil {
		return "", ""
	}
	for _, p := range host.parents {
		if f, v, ok := weightFile(host, p, uint64(w)); ok {
			return p.dir() + "/" + f, v
		}
	}
	return "", ""
}

// withPrivateRunsCgroup makes runs use a berth-runs cgroup of this test
// binary's own, so other packages' runs (which write the default weight to
// the shared berth-runs) cannot change the value the test reads; it is
// removed afterwards.
func withPrivateRunsCgroup(t testing.TB) {
	t.Helper()
	old := runsCgroup
	runsCgroup = "berth-runs-test-" + strconv.Itoa(os.Getpid())
	t.Cleanup(func() {
		if host, err := probeCgroups(); err == nil {
			for _, p := range host.parents {
				_ = os.Remove(p.dir())
			}
		}
		runsCgroup = old
	})
}
