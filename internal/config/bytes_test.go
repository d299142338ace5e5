package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
)

func TestBytesReadWhatMemoryLimitAcceptsAndWriteItBack(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		text  string
		want  config.Bytes
		write string
	}{
		{"512m", 512 << 20, "512m"},
		{"1g", 1 << 30, "1g"},
		{"2G", 2 << 30, "2g"},
		{"64kb", 64 << 10, "64k"},
		{"1024m", 1 << 30, "1g"},
		{"100", 100, "100"},
		{"7b", 7, "7"},
		{"0", 0, "0"},
	} {
		var b config.Bytes
		if err := b.UnmarshalText([]byte(tc.text)); err != nil || b != tc.want {
			t.Errorf("UnmarshalText(%q) = %d, %v; want %d", tc.text, b, err, tc.want)
		}
		if got := b.String(); got != tc.write {
			t.Errorf("Bytes(%d).String() = %q, want %q", b, got, tc.write)
		}
	}
	for _, bad := range []string{"lots", "", "-1m", "1t", "1.5g", "m", "99999999999g"} {
		b := config.Bytes(5)
		err := b.UnmarshalText([]byte(bad))
		if err == nil || !strings.Contains(err.Error(), "want a number with an optional unit b, k, m or g, like 512m") || b != 5 {
			t.Errorf("UnmarshalText(%q) = %d, %v; want an error and the value unchanged", bad, b, err)
		}
	}
}

// A size is read when the file is decoded, so its errors name the text the
// admin wrote, where they wrote it.
func TestSizeKeysRefuseSmallValuesAsWritten(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, toml, want string }{
		{"A memory limit under Docker's minimum", "[[agents]]\nid = \"a\"\ncontainer_mode = { memory_limit = \"1024k\" }\n", `berth.toml:3: agents[0].container_mode.memory_limit: "1024k" is below the minimum of 6m`},
		{"A memory limit of zero", "[agent_defaults]\ncontainer_mode.memory_limit = \"0\"\n[[agents]]\nid = \"a\"\n", `berth.toml:2: agent_defaults.container_mode.memory_limit: "0" is below the minimum of 6m`},
		{"A memory limit that is a number", "[[agents]]\nid = \"a\"\n[agents.container_mode]\nmemory_limit = 512\n", `berth.toml:4: agents[0].container_mode.memory_limit: must be a string, not an integer`},
		{"A quota written in kilobytes", "[[agents]]\nid = \"a\"\nworkspace_quota = \"2048kb\"\n", `berth.toml:3: agents[0].workspace_quota: "2048kb" is below the minimum of 16m (or 0 for no quota)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := config.Load(writeConfig(t, map[string]string{"berth.toml": tc.toml}))
			var errs config.Errors
			if !errors.As(err, &errs) || len(errs) != 1 || !strings.HasSuffix(errs[0].Error(), "/"+tc.want) {
				t.Fatalf("Load: %v\nwant exactly: %s", err, tc.want)
			}
		})
	}
}

func TestMemoryLimitDefaultsOnceInTheResolvedAgent(t *testing.T) {
	t.Parallel()
	c, err := config.Load(writeConfig(t, map[string]string{
		"berth.toml":           "[agent_defaults]\ncontainer_mode.memory_limit = \"768m\"\n[[agents]]\nid = \"bare\"\n[[agents]]\nid = \"own\"\ncontainer_mode.memory_limit = \"2g\"\n",
		"berth.d/10-more.toml": "[[agents]]\nid = \"later\"\n",
	}))
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]config.Bytes{"bare": 768 << 20, "own": 2 << 30, "later": 768 << 20} {
		if a, _ := c.Agent(id); a.Container.MemoryLimit != want {
			t.Errorf("agent %s: memory limit %s, want %s", id, a.Container.MemoryLimit, want)
		}
	}
	none, err := config.Load(writeConfig(t, map[string]string{"berth.toml": "[[agents]]\nid = \"a\"\n"}))
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := none.Agent("a"); a.Container.MemoryLimit != config.DefaultMemoryLimit || config.DefaultMemoryLimit != 512<<20 {
		t.Errorf("memory limit %s without the key, want the one default %s (512m)", a.Container.MemoryLimit, config.DefaultMemoryLimit)
	}
}
