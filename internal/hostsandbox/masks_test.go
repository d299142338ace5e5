package hostsandbox

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// What a mask would hide of a plan's paths is bound back; a path that is a
// masked directory, or contains one, does not lift the mask; links are
// followed, so the file /etc/resolv.conf points into /run stays.
func TestKeepPathsAreWhatAMaskWouldHide(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	run := filepath.Join(root, "run")
	target := filepath.Join(run, "resolve", "stub-resolv.conf")
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, []byte("nameserver 127.0.0.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "resolv.conf")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	masks := []MaskedDir{{Path: run}}
	tests := []struct {
		name string
		keep string
		want []string
	}{
		{"A_directory_inside_a_mask_is_kept", filepath.Join(run, "berth-egress", "r1"), []string{filepath.Join(run, "berth-egress", "r1")}},
		{"A_link_into_a_mask_keeps_its_target", link, []string{target}},
		{"The_masked_directory_itself_is_not_kept", run, nil},
		{"A_parent_of_the_mask_is_not_kept", root, nil},
		{"A_path_outside_every_mask_needs_no_keeping", "/usr/bin", nil},
		{"A_relative_path_is_ignored", "run/x", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := KeepPaths(masks, []string{tc.keep}); !slices.Equal(got, tc.want) {
				t.Errorf("KeepPaths(%s) = %q, want %q", tc.keep, got, tc.want)
			}
		})
	}
}

// Whichever side masks (the scheduler, or berth-agent itself), what the run
// needs inside a masked directory stays: its workspace, berth-agent, its
// allow paths and its egress socket's directory; the rest stays hidden.
func TestARunsOwnPathsStayVisibleUnderTheMasks(t *testing.T) {
	t.Parallel()
	run := t.TempDir()
	masks := []MaskedDir{{Path: run}}
	at := func(p string) string { return filepath.Join(run, p) }
	policy := agentproto.Policy{AllowRead: []string{at("ro"), "/usr"}, AllowReadWrite: []string{at("rw")}}
	tests := []struct {
		name         string
		egressSocket string
		want         []string
	}{
		{"A_run_with_an_egress_socket_keeps_its_directory", at("egress/r1/proxy.sock"), []string{at("ws"), at("bin/berth-agent"), at("rw"), at("ro"), at("egress/r1")}},
		{"A_run_without_egress_keeps_the_rest", "", []string{at("ws"), at("bin/berth-agent"), at("rw"), at("ro")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := KeepPaths(masks, KeepVisible(at("ws"), at("bin/berth-agent"), policy, tc.egressSocket))
			if !slices.Equal(got, tc.want) {
				t.Errorf("kept %q, want %q", got, tc.want)
			}
		})
	}
}

// A run sees its own /tmp and /var/tmp (the X11 and ICE masks under /tmp
// are then needless) and, of the directory holding every run's egress
// directory, only its own; an egress root inside a mask or around one is
// left as it is.
func TestRunMasksCoverTmpAndOtherRunsEgressDirectories(t *testing.T) {
	t.Parallel()
	paths := func(masks []MaskedDir) []string {
		var out []string
		for _, m := range masks {
			out = append(out, m.Path)
		}
		return out
	}
	host := paths(Masked())
	for _, dir := range []string{"/tmp", "/var/tmp"} {
		if fi, err := os.Lstat(dir); err == nil && fi.IsDir() && !slices.Contains(host, dir) {
			t.Errorf("Masked() = %q lacks %s", host, dir)
		}
	}
	if slices.Contains(host, "/tmp") && slices.ContainsFunc(host, func(p string) bool { return strings.HasPrefix(p, "/tmp/") }) {
		t.Errorf("Masked() = %q masks inside /tmp, which is masked as a whole", host)
	}
	if got := ScratchDirs(Masked()); !slices.Equal(got, slices.DeleteFunc(slices.Clone(host), func(p string) bool { return p != "/tmp" && p != "/var/tmp" })) {
		t.Errorf("ScratchDirs = %q, want the masked /tmp and /var/tmp of %q", got, host)
	}

	egressRoot, err := os.MkdirTemp("/var/lib", "berth-test-egress-")
	testenv.Need(t, err == nil, "cannot make a directory under /var/lib: %v", err)
	t.Cleanup(func() { os.RemoveAll(egressRoot) })
	tests := []struct {
		name   string
		socket string
		want   string // the extra mask, "" for none
	}{
		{"The_runs_egress_root_is_masked", egressRoot + "/r1/egress.sock", egressRoot},
		{"A_root_under_a_masked_directory_is_hidden_already", "/tmp/berth-egress/r1/egress.sock", ""},
		{"A_root_that_holds_a_masked_directory_is_left_alone", "/var/r1/egress.sock", ""},
		{"The_file_systems_root_is_left_alone", "/r1/egress.sock", ""},
		{"A_run_without_egress_gets_the_hosts_masks", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := paths(RunMasks(tc.socket))
			want := host
			if tc.want != "" {
				want = append(slices.Clone(host), tc.want)
			}
			if !slices.Equal(got, want) {
				t.Errorf("RunMasks(%q) = %q, want %q", tc.socket, got, want)
			}
		})
	}
}
