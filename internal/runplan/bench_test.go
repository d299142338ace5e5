package runplan_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
)

// BenchmarkCompile is what the scheduler pays to compile one host run's
// plan (the landlock policy: which system paths exist, what of the state
// dir to deny around the workspace), with the 8 agents of the whole-path
// benchmark, their workspaces made and the egress proxy served.
func BenchmarkCompile(b *testing.B) {
	dir, err := os.MkdirTemp("", "rp-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	state := filepath.Join(dir, "scheduler")
	text := `
[providers]
primary = "cloud"

[providers.cloud]
kind = "openai"
model = "m"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "CLOUD_KEY"
`
	for i := range 8 {
		text += fmt.Sprintf("\n[[agents]]\nid = \"agent%d\"\n", i)
	}
	cfg := loadConfig(b, text)
	cfg.Sources = []string{filepath.Join(dir, "etc", "berth.toml")}
	for i := range 8 {
		id := fmt.Sprintf("agent%d", i)
		if err := os.MkdirAll(filepath.Join(state, "agents", id), 0o700); err != nil {
			b.Fatal(err)
		}
	}
	for _, d := range []string{"egress", "workspaces", "cache"} {
		if err := os.MkdirAll(filepath.Join(state, d), 0o700); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(state, "scheduler.db"), nil, 0o600); err != nil {
		b.Fatal(err)
	}
	host := runplan.HostFacts{
		StateDir:   state,
		EgressDir:  filepath.Join(state, "egress"),
		RunUser:    runplan.AgentUserFor(config.DefaultAgentUIDs.First),
		AgentUser:  true,
		EgressUser: &isolation.RunUser{Name: "nobody", UID: 65534, GID: 65534},
		Getenv:     func(k string) string { return map[string]string{"CLOUD_KEY": secret}[k] },
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := runplan.Compile(cfg, fmt.Sprintf("agent%d", i%8), "20261201T113402_018006016_6bcbbdf01b", host); err != nil {
			b.Fatal(err)
		}
	}
}
