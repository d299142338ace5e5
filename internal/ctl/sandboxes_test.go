package ctl

import (
	"bytes"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
)

func TestTheSandboxListingMatchesItsGoldenFile(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := writeSandboxList(&out, []busapi.Sandbox{
		{ID: "sbx_20261201T093000_000000000_aa", Agent: "coder", Connector: "slack", Channel: "C123", Thread: "1712.5", Backend: "landlock",
			Started: at, LastActivity: at.Add(5 * time.Minute), IdleFor: 123 * time.Second, Runs: 4, MemoryBytes: 19 << 20},
		{ID: "sbx_20261201T093100_000000000_bb", Agent: "coder", Connector: "hooks", Channel: "ops room", Thread: "", Backend: "container",
			Started: at.Add(time.Minute), LastActivity: at.Add(6 * time.Minute), Busy: true, Runs: 1, MemoryBytes: -1,
			MemoryUnknown: `the memory of pod berth/berth-kept-x is unknown: cannot read its cgroup with cat over pods/exec: pods "berth-kept-x" is forbidden`},
	})
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "sandboxes.txt", out.Bytes())
}
