package config_test

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
)

// [kubernetes] host_id names the berth host among those sharing a cluster
// (ADR 28): kept as written, refused with file, line and key when it is no
// Kubernetes label value (it labels every pod).
func TestKubernetesHostIDIsALabelValue(t *testing.T) {
	t.Parallel()
	c, err := config.Load(writeConfig(t, map[string]string{"berth.toml": "[kubernetes]\nhost_id = \"rack-7.berth\"\n"}))
	if err != nil || c.Kubernetes.HostID != "rack-7.berth" {
		t.Fatalf("Load = %v, host_id %q", err, c.Kubernetes.HostID)
	}
	for _, bad := range []string{"two words", "-leading", strings.Repeat("x", 64), ""} {
		_, err := config.Load(writeConfig(t, map[string]string{"berth.toml": "[kubernetes]\nhost_id = \"" + bad + "\"\n"}))
		if err == nil || !strings.Contains(err.Error(), "berth.toml:2: kubernetes.host_id:") {
			t.Errorf("host_id %q: Load = %v, want an error at berth.toml:2 naming kubernetes.host_id", bad, err)
		}
	}
}
