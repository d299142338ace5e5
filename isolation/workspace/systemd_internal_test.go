package workspace

import (
	"testing"

	"github.com/godbus/dbus/v5"
)

func TestWorkspaceMountUnitIsNamedAfterTheWorkspaceAndMountsTheImageThere(t *testing.T) {
	t.Parallel()
	dir, image := "/var/lib/berth/scheduler/agents/ops-bot", "/var/lib/berth/scheduler/workspaces/ops-bot.img"
	if got, want := UnitName(dir), `var-lib-berth-scheduler-agents-ops\x2dbot.mount`; got != want {
		t.Errorf("UnitName = %q; want %q (systemd refuses a mount unit not named after its Where=)", got, want)
	}
	want := map[string]string{"What": image, "Where": dir, "Type": "ext4", "Options": "loop,nodev,nosuid"}
	got := map[string]string{}
	for _, p := range unitProperties(image, dir) {
		if s, ok := p.Value.Value().(string); ok && p.Value.Signature() == dbus.SignatureOf("") {
			got[p.Name] = s
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("property %s = %q; want %q", k, got[k], v)
		}
	}
}
