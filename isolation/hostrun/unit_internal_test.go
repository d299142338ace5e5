package hostrun

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
)

// The transient unit's properties decide what a run under systemd may do;
// the agent's request (with the provider key) must never be one of them.
func TestTransientUnitProperties(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name              string
		policy            agentproto.Policy
		cutNetwork        bool
		wantPrivateNet    bool
		wantProtectStrict bool
	}{
		{"Confined_run_without_network_is_cut_off", agentproto.Policy{}, true, true, true},
		{"Confined_run_with_network_keeps_it", agentproto.Policy{Network: true}, false, false, true},
		{"Unrestricted_run_without_network_is_cut_off_too", agentproto.Policy{Unrestricted: true}, true, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec := isolation.Spec{
				Plan:    isolation.Plan{RunID: "r1", AgentID: "a", Workspace: "/ws", AgentBinary: "/usr/libexec/berth/berth-agent", Policy: tc.policy},
				Request: agentproto.Request{RunID: "r1", Provider: agentproto.Provider{Key: "sk-SECRET-KEY"}},
			}
			u := newUnitRun(spec, []byte(`{"provider":{"key":"sk-SECRET-KEY"}}`), nil)
			if u.cutNetwork != tc.cutNetwork {
				t.Errorf("cut network = %v, want %v", u.cutNetwork, tc.cutNetwork)
			}
			props := unitProperties(u, UnitName("r1"), 10, 11, 12)
			got := map[string]string{}
			for _, p := range props {
				got[p.Name] = p.Value.String()
				if strings.Contains(p.Value.String(), "SECRET") {
					t.Fatalf("property %s carries the provider key: %s", p.Name, p.Value)
				}
			}
			if _, ok := got["PrivateNetwork"]; ok != tc.wantPrivateNet {
				t.Errorf("PrivateNetwork set = %v, want %v", ok, tc.wantPrivateNet)
			}
			if _, ok := got["ProtectSystem"]; ok != tc.wantProtectStrict {
				t.Errorf("ProtectSystem set = %v, want %v", ok, tc.wantProtectStrict)
			}
			for _, name := range []string{"MemoryMax", "TasksMax"} {
				if _, ok := got[name]; !ok {
					t.Errorf("%s missing: every run gets resource limits", name)
				}
			}
		})
	}
}

// A confined unit hides the host's sockets behind a tmpfs on /run and gets
// its own IPC namespace; what the plan names under /run (its egress socket
// directory, an allowed path, the resolver's file) is bound back.
func TestTransientUnitHidesTheHostsSocketsAndSeparatesIPC(t *testing.T) {
	t.Parallel()
	egress := &isolation.EgressPlan{Socket: "/run/berth-test-egress/r1/egress.sock", SandboxSocket: "/run/berth-test-egress/r1/egress.sock"}
	tests := []struct {
		name         string
		policy       agentproto.Policy
		wantMasks    bool
		wantReadOnly string
	}{
		{"A_confined_run_masks_run_and_binds_its_egress_directory_back", agentproto.Policy{AllowRead: []string{"/run/berth-test-allowed"}}, true, "/run/berth-test-allowed"},
		{"An_unrestricted_run_gets_no_masks", agentproto.Policy{Unrestricted: true}, false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec := isolation.Spec{Plan: isolation.Plan{RunID: "r1", Workspace: "/ws", AgentBinary: "/usr/libexec/berth/berth-agent", Policy: tc.policy, Egress: egress}}
			props := map[string]any{}
			for _, p := range unitProperties(newUnitRun(spec, nil, nil), UnitName("r1"), 10, 11, 12) {
				props[p.Name] = p.Value.Value()
			}
			tmpfs, _ := props["TemporaryFileSystem"].([]tmpfsMount)
			hasRun := slices.ContainsFunc(tmpfs, func(m tmpfsMount) bool { return m.Path == "/run" && strings.Contains(m.Options, "nosuid") })
			if hasRun != tc.wantMasks {
				t.Errorf("TemporaryFileSystem %+v: /run masked = %v, want %v", tmpfs, hasRun, tc.wantMasks)
			}
			if ipc, _ := props["PrivateIPC"].(bool); ipc != tc.wantMasks {
				t.Errorf("PrivateIPC = %v, want %v", ipc, tc.wantMasks)
			}
			if !tc.wantMasks {
				return
			}
			rw, _ := props["BindPaths"].([]bindPath)
			ro, _ := props["BindReadOnlyPaths"].([]bindPath)
			bound := func(list []bindPath, path string) bool {
				return slices.ContainsFunc(list, func(b bindPath) bool { return b.Source == path && b.Destination == path })
			}
			if !bound(rw, "/run/berth-test-egress/r1") {
				t.Errorf("BindPaths %+v lack the egress socket's directory", rw)
			}
			if bound(ro, "/run/berth-test-egress/r1") {
				t.Errorf("BindReadOnlyPaths %+v bind the egress directory a second time", ro)
			}
			if !bound(ro, tc.wantReadOnly) {
				t.Errorf("BindReadOnlyPaths %+v lack %s", ro, tc.wantReadOnly)
			}
		})
	}
}

// Under systemd a confined run's /tmp and /var/tmp are tmpfs of its own of
// 256 MiB (PrivateTmp would not bound them), writable and executable as a
// container's /tmp; the directory of every run's egress directory is a tmpfs
// with only the run's own bound back; and /tmp is never bound from the host
// over the run's own, even when the policy names it.
func TestATransientUnitHasItsOwnTmpAndNoOtherRunsEgressDirectory(t *testing.T) {
	t.Parallel()
	// Outside /tmp, whose mask hides every egress directory under it already.
	egressRoot, err := os.MkdirTemp("/var/lib", "berth-test-egress-")
	testenv.Need(t, err == nil, "cannot make a directory under /var/lib: %v", err)
	t.Cleanup(func() { os.RemoveAll(egressRoot) })
	socket := egressRoot + "/r1/egress.sock"
	spec := isolation.Spec{Plan: isolation.Plan{RunID: "r1", Workspace: "/ws", AgentBinary: "/usr/libexec/berth/berth-agent",
		Policy: withScratch(agentproto.Policy{AllowReadWrite: []string{"/tmp"}}),
		Egress: &isolation.EgressPlan{Socket: socket, SandboxSocket: socket}}}
	props := map[string]any{}
	for _, p := range unitProperties(newUnitRun(spec, nil, nil), UnitName("r1"), 10, 11, 12) {
		props[p.Name] = p.Value.Value()
	}
	if _, ok := props["PrivateTmp"]; ok {
		t.Errorf("PrivateTmp is set: its /tmp has no size limit")
	}
	tmpfs, _ := props["TemporaryFileSystem"].([]tmpfsMount)
	options := map[string]string{}
	for _, m := range tmpfs {
		options[m.Path] = m.Options
	}
	for _, dir := range []string{"/tmp", "/var/tmp"} {
		if got := options[dir]; got != "mode=1777,size=256m,nosuid,nodev" {
			t.Errorf("TemporaryFileSystem %s: %q, want mode=1777,size=256m,nosuid,nodev", dir, got)
		}
	}
	if got := options[egressRoot]; !strings.Contains(got, "noexec") {
		t.Errorf("TemporaryFileSystem over the runs' egress directories %s: %q, want a mask (%+v)", egressRoot, got, tmpfs)
	}
	rw, _ := props["BindPaths"].([]bindPath)
	ro, _ := props["BindReadOnlyPaths"].([]bindPath)
	for _, b := range append(rw, ro...) {
		if b.Source == "/tmp" || b.Source == "/var/tmp" {
			t.Errorf("the host's %s is bound over the run's own: %+v", b.Source, b)
		}
	}
	if !slices.ContainsFunc(rw, func(b bindPath) bool { return b.Source == egressRoot+"/r1" }) {
		t.Errorf("BindPaths %+v lack the run's own egress directory", rw)
	}
	if !slices.Equal(spec.Policy.AllowReadWrite, []string{"/tmp", "/var/tmp"}) {
		t.Errorf("the run's Landlock policy grants %q read-write, want its own /tmp and /var/tmp once each", spec.Policy.AllowReadWrite)
	}
}

func TestHostRunsHonourThePlansMemoryLimit(t *testing.T) {
	t.Parallel()
	spec := isolation.Spec{Plan: isolation.Plan{RunID: "r1", Workspace: "/ws", AgentBinary: "/bin/true", Limits: isolation.Limits{MemoryBytes: 1 << 30}}}
	u := newUnitRun(spec, nil, nil)
	props := unitProperties(u, UnitName("r1"), 10, 11, 12)
	for _, p := range props {
		if p.Name == "MemoryMax" {
			if got := p.Value.Value(); got != uint64(1<<30) {
				t.Fatalf("MemoryMax = %v, want 1 GiB from the plan", got)
			}
			return
		}
	}
	t.Fatal("no MemoryMax property")
}

// endedUnit is a sandbox whose unit already ended the way systemd reported.
type endedUnit struct {
	exit    isolation.Exit
	drained chan struct{}
}

func (u *endedUnit) Handle() string                               { return unitHandlePrefix + UnitName("r1") }
func (u *endedUnit) Wait(context.Context) (isolation.Exit, error) { return u.exit, nil }
func (u *endedUnit) Kill(context.Context) error                   { return nil }
func (u *endedUnit) Drained() <-chan struct{}                     { return u.drained }
func (u *endedUnit) Inspect(context.Context, bool) bool           { return false }
func (u *endedUnit) Release()                                     {}

// How systemd says a unit ended must give the reasons every backend gives:
// an OOM kill is "out of memory" here as in a container.
func TestTransientUnitEndsGiveTheSameReasonsAsEveryBackend(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		end    unitEnd
		reason string
		detail string
	}{
		{"OOM_kill_is_out_of_memory", unitEnd{code: cldKilled, status: 9, result: "oom-kill"}, isolation.ReasonOutOfMemory, "memory limit of 256m"},
		{"RuntimeMaxSec_is_a_timeout", unitEnd{code: cldKilled, status: 9, result: "timeout"}, isolation.ReasonTimeout, "runtime limit"},
		{"Systemd_exit_status_is_cannot_start", unitEnd{code: cldExited, status: 217, result: "exit-code"}, isolation.ReasonStart, "exit status 217"},
		{"Signal_is_a_crash", unitEnd{code: cldKilled, status: 11, result: "signal"}, isolation.ReasonCrashed, "segmentation fault"},
		{"Exit_3_is_a_confinement_failure", unitEnd{code: cldExited, status: 3, result: "exit-code"}, isolation.ReasonConfinement, "exit code 3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec := isolation.Spec{Plan: isolation.Plan{RunID: "r1", Limits: isolation.Limits{MemoryBytes: 256 << 20}}}
			drained := make(chan struct{})
			close(drained)
			_, err := isolation.Supervise(context.Background(), spec, func(context.Context, isolation.Spec, []byte, io.Writer, io.Writer) (isolation.Sandbox, error) {
				return &endedUnit{exit: exitOf(tc.end, UnitName("r1")), drained: drained}, nil
			})
			if got := isolation.ReasonOf(err); got != tc.reason || !strings.Contains(err.Error(), tc.detail) {
				t.Fatalf("unit end %+v gave %v, want reason %q with %q", tc.end, err, tc.reason, tc.detail)
			}
		})
	}
}

// systemd's User= needs a passwd entry even for a numeric uid; an agent's
// own uid from agent_uids has none, so its unit switches through setpriv.
func TestAUnitForAUIDWithoutANameSwitchesThroughSetpriv(t *testing.T) {
	t.Parallel()
	spec := isolation.Spec{Plan: isolation.Plan{RunID: "r1", AgentID: "a", Workspace: "/ws", AgentBinary: "/usr/libexec/berth/berth-agent"}}
	for _, tc := range []struct {
		name     string
		uid      uint32
		wantUser bool
	}{
		{"A uid with a passwd entry is the unit's User", 65534, true},
		{"A uid without one is set by setpriv", 1879048192 + 4242, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := newUnitRun(spec, nil, &syscall.Credential{Uid: tc.uid, Gid: tc.uid})
			got := map[string]string{}
			for _, p := range unitProperties(u, UnitName("r1"), 10, 11, 12) {
				got[p.Name] = p.Value.String()
			}
			_, hasUser := got["User"]
			exec := got["ExecStart"]
			if hasUser != tc.wantUser {
				t.Errorf("User set = %v, want %v (ExecStart %s)", hasUser, tc.wantUser, exec)
			}
			usesSetpriv := strings.Contains(exec, "setpriv") && strings.Contains(exec, fmt.Sprintf("--reuid=%d", tc.uid)) && strings.Contains(exec, "--clear-groups")
			if usesSetpriv == tc.wantUser {
				t.Errorf("ExecStart = %s: setpriv = %v, want %v", exec, usesSetpriv, !tc.wantUser)
			}
		})
	}
}
