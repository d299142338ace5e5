package runplan_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
	"github.com/berth-dev/berth/isolation/hostrun"
)

// A memory limit is read once, from berth.toml, and defaulted once, in the
// resolved config: the plan carries that number to the backend, which shows
// it as the container's Memory, or the host run's cgroup (or rlimit) value,
// without reading or defaulting it again.
func TestAMemoryLimitWalksFromBerthTomlToTheContainerOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "berth.toml")
	const text = `[[agents]]
id = "sized"
provider = "local"
container_mode = { enabled = true, network = "none", memory_limit = "1536m" }

[[agents]]
id = "bare"
provider = "local"
container_mode = { enabled = true, network = "none" }

[[agents]]
id = "host"
provider = "local"
container_mode.memory_limit = "2G"

[scheduler]
run_as = "nobody"
# Where this host has no writable cgroup, Explain shows the rlimit instead.
allow_rlimit_fallback = true
`
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	b, err := container.New(container.Options{Instance: dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		agent  string
		bytes  int64
		memory string // the container's Memory= line, or the host run's limit
	}{
		{"sized", 1536 << 20, "Memory=1536m with MemorySwap=1536m"},
		{"bare", int64(config.DefaultMemoryLimit), "Memory=512m with MemorySwap=512m"},
		{"host", 2 << 30, "=2147483648"},
	} {
		p, err := runplan.Compile(cfg, tc.agent, "r1", facts(t, nil))
		if err != nil {
			t.Fatalf("Compile %s: %v", tc.agent, err)
		}
		if p.Limits.MemoryBytes != tc.bytes {
			t.Errorf("agent %s: plan memory %d, want %d", tc.agent, p.Limits.MemoryBytes, tc.bytes)
		}
		if p.Backend != isolation.BackendContainer {
			// MemoryMax=, memory.max=, memory.limit_in_bytes= or
			// RLIMIT_DATA=, as this host can hold it.
			holds := hostrun.Runner{}.Explain(p).Holds
			if !slices.ContainsFunc(holds, func(h string) bool { return strings.Contains(h, tc.memory) }) {
				t.Errorf("agent %s: host run holds %q, want a limit %q", tc.agent, holds, tc.memory)
			}
			continue
		}
		holds := b.Explain(p).Holds
		if !slices.ContainsFunc(holds, func(h string) bool { return strings.HasPrefix(h, tc.memory+" ") }) {
			t.Errorf("agent %s: container holds %q, want %q", tc.agent, holds, tc.memory)
		}
	}
	if config.DefaultMemoryLimit != 512<<20 {
		t.Errorf("the one default is %s, want 512m", config.DefaultMemoryLimit)
	}
}
