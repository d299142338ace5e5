package hostrun

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	sdbus "github.com/coreos/go-systemd/v22/dbus"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
)

// Under systemd a kept host sandbox is confined exactly as a run's unit is;
// only what makes it live past one request differs: berth-agent serves, no
// RuntimeMaxSec cuts its life at the first request's timeout, and the unit
// ends with its agent (so with a scheduler that is gone) after TERM, the
// plan's kill grace and KILL for what the tools left.
func TestAKeptSandboxUnitIsARunsUnitThatServesUntilStopped(t *testing.T) {
	t.Parallel()
	spec := isolation.Spec{
		Plan: isolation.Plan{RunID: "sbx_1", AgentID: "a", Workspace: "/ws", AgentBinary: "/usr/libexec/berth/berth-agent",
			Timeout: 30 * time.Second, KillGrace: 3 * time.Second,
			Limits: isolation.Limits{MemoryBytes: 256 << 20, Pids: 64, NanoCPUs: 5e8}},
		Request: agentproto.Request{RunID: "sbx_1", Provider: agentproto.Provider{Key: "sk-SECRET-KEY"}},
	}
	name := SandboxUnitName(spec.RunID)
	if name != "berth-sandbox-sbx_1.service" {
		t.Errorf("unit name %q, want berth-sandbox-sbx_1.service", name)
	}
	u := newUnitRun(spec, nil, nil)
	values := func(props []sdbus.Property) map[string]string {
		out := map[string]string{}
		for _, p := range props {
			out[p.Name] = p.Value.String()
		}
		return out
	}
	run := values(unitProperties(u, UnitName(spec.RunID), 10, 11, 12))
	kept := values(keptUnitProperties(u, name, 10, 11, 12))
	differ := []string{"Description", "ExecStart", "RemainAfterExit", "RuntimeMaxUSec", "TimeoutStopUSec"}
	for key, v := range run {
		if !slices.Contains(differ, key) && kept[key] != v {
			t.Errorf("%s = %s, want the run unit's %s", key, kept[key], v)
		}
	}
	for key, v := range kept {
		if strings.Contains(v, "SECRET") {
			t.Fatalf("property %s carries the provider key: %s", key, v)
		}
		if _, ok := run[key]; !ok && !slices.Contains(differ, key) {
			t.Errorf("%s = %s is not a run unit's property", key, v)
		}
	}
	if _, ok := kept["RuntimeMaxUSec"]; ok {
		t.Errorf("RuntimeMaxUSec = %s: the plan's timeout bounds a request, not the sandbox", kept["RuntimeMaxUSec"])
	}
	if !strings.Contains(kept["ExecStart"], `["/usr/libexec/berth/berth-agent", "serve"]`) {
		t.Errorf("ExecStart = %s, want berth-agent serve", kept["ExecStart"])
	}
	if kept["RemainAfterExit"] != "false" {
		t.Errorf("RemainAfterExit = %s: a unit left active after its agent ended keeps what its tools left running", kept["RemainAfterExit"])
	}
	if kept["TimeoutStopUSec"] != "@t 3000000" {
		t.Errorf("TimeoutStopUSec = %s, want the plan's kill grace of 3 s", kept["TimeoutStopUSec"])
	}
	for _, key := range []string{"KillMode", "MemoryMax", "TasksMax", "CPUQuotaPerSecUSec", "ProtectSystem", "PrivateNetwork", "TemporaryFileSystem"} {
		if _, ok := kept[key]; !ok {
			t.Errorf("%s missing: a sandbox is confined as a run is", key)
		}
	}
}

// Start under systemd goes to systemd (here: finds no systemd to talk to)
// instead of refusing the backend, and Kill takes a sandbox's unit handle
// as a berth unit.
func TestUnderSystemdAKeptHostSandboxIsStartedAsAUnit(t *testing.T) {
	t.Parallel()
	testenv.Need(t, !SystemdAvailable(), "this test needs a machine where systemd is not PID 1 (it would start a real unit)")
	spec := isolation.Spec{Plan: isolation.Plan{RunID: "sbx_2", AgentID: "a", Workspace: t.TempDir(), AgentBinary: "/usr/libexec/berth/berth-agent",
		Limits: isolation.Limits{MemoryBytes: 256 << 20, Pids: 64, NanoCPUs: 5e8}}}
	_, err := Runner{AllowRoot: true, Systemd: func() bool { return true }}.Start(context.Background(), spec)
	if isolation.ReasonOf(err) == isolation.ReasonNoBackend {
		t.Errorf("Start refused the backend under systemd: %v", err)
	}
	if err == nil || !strings.Contains(err.Error(), "cannot connect to systemd") {
		t.Errorf("Start = %v, want it to have tried systemd", err)
	}
	err = Kill(context.Background(), unitHandlePrefix+SandboxUnitName("sbx_2"))
	if err == nil || strings.Contains(err.Error(), "not a berth run unit") {
		t.Errorf("Kill of a sandbox's unit = %v, want it to have tried systemd", err)
	}
	if err := Kill(context.Background(), unitHandlePrefix+"sshd.service"); err == nil || !strings.Contains(err.Error(), "not a berth run unit") {
		t.Errorf("Kill of sshd.service = %v, want it refused", err)
	}
}
