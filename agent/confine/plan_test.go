package confine

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"

	"github.com/berth-dev/berth/internal/agentproto"
)

// tree builds a directory tree for planning and returns its resolved root:
//
//	allowed/a.txt
//	allowed/sub/secret.txt
//	allowed/sub/ok.txt
//	allowed/sub/deeper/x.txt
//	allowed/etc-link -> /etc
//	denied/inner/y.txt
//	to-allowed -> allowed
func tree(t *testing.T) string {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"allowed/a.txt", "allowed/sub/secret.txt", "allowed/sub/ok.txt", "allowed/sub/deeper/x.txt", "denied/inner/y.txt"} {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc", filepath.Join(root, "allowed/etc-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("allowed", filepath.Join(root, "to-allowed")); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestPlan(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	tests := []struct {
		name                  string
		read, readWrite, deny []string
		want                  []string // "r|rw dir|file relative-path"
		wantErr               string
	}{
		{
			name: "An_allowed_directory_without_denied_paths_is_one_directory_rule",
			read: []string{"allowed"},
			want: []string{"r dir allowed"},
		},
		{
			name: "A_denied_file_is_carved_out_of_an_allowed_directory_and_symlink_entries_get_no_rule",
			read: []string{"allowed"},
			deny: []string{"allowed/sub/secret.txt"},
			want: []string{"r file allowed/a.txt", "r dir allowed/sub/deeper", "r file allowed/sub/ok.txt"},
		},
		{
			name:      "A_denied_directory_is_carved_out_of_a_read_write_directory",
			readWrite: []string{"allowed"},
			deny:      []string{"allowed/sub"},
			want:      []string{"rw file allowed/a.txt"},
		},
		{
			name: "An_allowed_path_inside_a_denied_one_is_dropped",
			read: []string{"denied/inner", "allowed"},
			deny: []string{"denied"},
			want: []string{"r dir allowed"},
		},
		{
			name: "Denying_the_allowed_directory_itself_drops_it",
			read: []string{"allowed"},
			deny: []string{"allowed"},
			want: nil,
		},
		{
			name: "Missing_allowed_paths_are_skipped",
			read: []string{"missing", "allowed"},
			want: []string{"r dir allowed"},
		},
		{
			// Created during the run, it must still be out of reach: the
			// directory is split into what exists now.
			name: "A_denied_path_that_does_not_exist_yet_is_carved_out",
			read: []string{"allowed"},
			deny: []string{"allowed/missing.txt"},
			want: []string{"r file allowed/a.txt", "r dir allowed/sub"},
		},
		{
			// Nothing can be there while a.txt is a file: denied anyway.
			name: "A_denied_path_beneath_a_file_is_no_error",
			read: []string{"allowed"},
			deny: []string{"allowed/a.txt/inner"},
			want: []string{"r file allowed/a.txt", "r dir allowed/sub"},
		},
		{
			name:    "An_allowed_path_beneath_a_file_fails_the_plan",
			read:    []string{"allowed/a.txt/inner"},
			wantErr: "cannot resolve allowed path",
		},
		{
			name: "A_symlinked_allowed_path_lands_on_its_target",
			read: []string{"to-allowed"},
			want: []string{"r dir allowed"},
		},
		{
			name: "A_deny_named_through_a_symlink_still_applies",
			read: []string{"allowed/sub"},
			deny: []string{"to-allowed/sub/secret.txt"},
			want: []string{"r dir allowed/sub/deeper", "r file allowed/sub/ok.txt"},
		},
		{
			name:      "Read_write_and_read_rules_are_both_kept_so_read_write_wins_beneath",
			read:      []string{"allowed"},
			readWrite: []string{"allowed/sub"},
			want:      []string{"rw dir allowed/sub", "r dir allowed"},
		},
		{
			name: "An_allowed_file_gets_a_file_rule",
			read: []string{"allowed/a.txt"},
			want: []string{"r file allowed/a.txt"},
		},
		{
			name:    "A_relative_allowed_path_is_refused",
			read:    []string{"relative/path"},
			wantErr: "not absolute",
		},
		{
			name:    "A_relative_denied_path_is_refused",
			deny:    []string{"relative/path"},
			wantErr: "not absolute",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := tree(t)
			abs := func(paths []string) []string {
				var out []string
				for _, p := range paths {
					if strings.HasPrefix(p, "relative") {
						out = append(out, p)
						continue
					}
					out = append(out, filepath.Join(root, p))
				}
				return out
			}
			rules, err := Plan(abs(tc.read), abs(tc.readWrite), abs(tc.deny), quiet)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Plan error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			var got []string
			for _, r := range rules {
				access, kind := "r", "file"
				if r.Access == ReadWrite {
					access = "rw"
				}
				if r.Dir {
					kind = "dir"
				}
				rel, err := filepath.Rel(root, r.Path)
				if err != nil || strings.HasPrefix(rel, "..") {
					t.Fatalf("rule %+v lies outside the test tree", r)
				}
				got = append(got, access+" "+kind+" "+rel)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Plan rules:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestRightsGiveFilesNoDirectoryRights(t *testing.T) {
	t.Parallel()
	handled := landlock.V7.HandledAccessFS
	dirOnly := landlock.AccessFSSet(ll.AccessFSReadDir | ll.AccessFSMakeReg | ll.AccessFSMakeDir | ll.AccessFSRemoveFile | ll.AccessFSRefer)

	for _, access := range []Access{Read, ReadWrite} {
		if got := rights(Rule{Access: access}, handled); got&dirOnly != 0 {
			t.Errorf("%s file rule has directory rights %v", access, got&dirOnly)
		}
	}
	if got := rights(Rule{Dir: true, Access: Read}, handled); got&ll.AccessFSWriteFile != 0 || got&ll.AccessFSReadDir == 0 {
		t.Errorf("read directory rule has rights %v, want read_dir without write_file", got)
	}
	if got := rights(Rule{Dir: true, Access: ReadWrite}, handled); got != handled {
		t.Errorf("read-write directory rule has rights %v, want everything handled (%v)", got, handled)
	}
	if got := rights(Rule{Dir: true, Access: ReadWrite}, landlock.V1.HandledAccessFS); got&^landlock.V1.HandledAccessFS != 0 {
		t.Errorf("rights exceed what ABI 1 handles: %v", got)
	}
}

func TestEnforceRefusesWithoutEnoughABI(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	tests := []struct {
		name    string
		network bool
		abi     int
		want    string
	}{
		{"No_Landlock_is_refused", true, 0, "kernel has no Landlock (ABI 0)"},
		{"ABI_3_with_network_false_is_refused", false, 3, "needs ABI 4"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Both refusals happen before anything is restricted, so the test
			// process stays unconfined.
			thread, err := Enforce(agentproto.Policy{AllowRead: []string{"/usr"}, Network: tc.network}, tc.abi, quiet)
			if thread != nil || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Enforce error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// The resolver must answer as filepath.EvalSymlinks does, path by path and
// error by error, although it lstats each prefix only once.
func TestTheResolverResolvesAsEvalSymlinksDoes(t *testing.T) {
	t.Parallel()
	root := tree(t)
	for _, link := range []struct{ name, target string }{
		{"loop-a", "loop-b"},
		{"loop-b", "loop-a"},
		{"dangling", "nowhere/at/all"},
		{"allowed/sub/up", "../../denied"},
		{"abs-sub", root + "/allowed/sub"},
		{"chain", "to-allowed"},
	} {
		if err := os.Symlink(link.target, filepath.Join(root, link.name)); err != nil {
			t.Fatal(err)
		}
	}
	paths := []string{
		"/", "/usr", "/bin", "/bin/sh", "/proc/self", "/proc/self/status", "/etc/ssl/certs", "/dev/null",
		root + "/to-allowed/sub/ok.txt",
		root + "/chain/sub/deeper",
		root + "/abs-sub/secret.txt",
		root + "/allowed/sub/up/inner/y.txt",
		root + "/allowed/sub/up/../allowed/a.txt",
		root + "/allowed/./sub//ok.txt/",
		root + "/allowed/a.txt/below",
		root + "/allowed/missing/below",
		root + "/dangling",
		root + "/dangling/below",
		root + "/loop-a",
		root + "/loop-a/below",
		root + "/allowed/etc-link/passwd",
		root + "/../../..",
		"/..",
		"/../usr/./lib",
	}
	r := newResolver()
	// Twice through the same resolver: the second round is answered from
	// what it remembers.
	for round := range 2 {
		for _, p := range paths {
			want, wantErr := filepath.EvalSymlinks(p)
			got, err := r.evalSymlinks(p)
			if got != want || (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
				t.Errorf("round %d: evalSymlinks(%q) = %q, %v; EvalSymlinks gives %q, %v", round, p, got, err, want, wantErr)
			}
			if wantErr != nil && errors.Is(wantErr, fs.ErrNotExist) != errors.Is(err, fs.ErrNotExist) {
				t.Errorf("round %d: evalSymlinks(%q) error %v is not-exist %v, EvalSymlinks' %v", round, p, err, !errors.Is(wantErr, fs.ErrNotExist), wantErr)
			}
		}
	}
}

func TestPlanThroughLinksLoopsAndSharedPrefixes(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	tests := []struct {
		name                  string
		read, readWrite, deny []string
		want                  []string
		wantErr               string
	}{
		{
			name: "A_denied_path_named_through_a_symlinked_prefix_is_carved_out_of_the_real_directory",
			read: []string{"to-allowed"},
			deny: []string{"to-allowed/sub/secret.txt"},
			want: []string{"r file allowed/a.txt", "r dir allowed/sub/deeper", "r file allowed/sub/ok.txt"},
		},
		{
			name: "A_missing_denied_path_beneath_a_symlinked_prefix_is_carved_out_of_the_real_directory",
			read: []string{"allowed"},
			deny: []string{"to-allowed/sub/not-yet.txt"},
			want: []string{"r file allowed/a.txt", "r dir allowed/sub/deeper", "r file allowed/sub/ok.txt", "r file allowed/sub/secret.txt"},
		},
		{
			name: "A_denied_path_listed_after_others_still_splits_a_directory_they_resolved",
			read: []string{"allowed/sub/deeper", "allowed"},
			deny: []string{"denied", "to-allowed/sub/deeper/x.txt"},
			want: []string{"r file allowed/a.txt", "r file allowed/sub/ok.txt", "r file allowed/sub/secret.txt"},
		},
		{
			name:    "An_allowed_path_through_a_symlink_loop_is_refused",
			read:    []string{"allowed", "loop-a/x"},
			wantErr: "too many links",
		},
		{
			name:    "A_denied_path_through_a_symlink_loop_is_refused",
			read:    []string{"allowed"},
			deny:    []string{"loop-b"},
			wantErr: "too many links",
		},
		{
			name: "A_dangling_allowed_symlink_is_skipped",
			read: []string{"dangling", "allowed/a.txt"},
			want: []string{"r file allowed/a.txt"},
		},
		{
			name:    "An_allowed_path_beneath_a_file_is_refused",
			read:    []string{"allowed/a.txt/below"},
			wantErr: "not a directory",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := tree(t)
			for _, link := range []struct{ name, target string }{{"loop-a", "loop-b"}, {"loop-b", "loop-a"}, {"dangling", "nowhere"}} {
				if err := os.Symlink(link.target, filepath.Join(root, link.name)); err != nil {
					t.Fatal(err)
				}
			}
			abs := func(paths []string) []string {
				var out []string
				for _, p := range paths {
					out = append(out, filepath.Join(root, p))
				}
				return out
			}
			rules, err := Plan(abs(tc.read), abs(tc.readWrite), abs(tc.deny), quiet)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Plan error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			if got := describe(t, root, rules); !slices.Equal(got, tc.want) {
				t.Errorf("Plan rules:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// Enforce plans the agent's and the tools' policies through one resolver;
// the second plan must be what a fresh Plan makes of it.
func TestASecondPlanThroughTheSameResolverIsAFreshPlan(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	root := tree(t)
	read := []string{"/usr", "/bin", "/proc/self", "/etc/passwd", root + "/to-allowed"}
	readWrite := []string{root + "/allowed/sub", "/dev/null"}
	r := newResolver()
	if _, err := r.plan(read, readWrite, []string{root + "/denied"}, quiet); err != nil {
		t.Fatal(err)
	}
	// The tools' plan denies more, beneath what the first plan resolved.
	toolsDeny := []string{root + "/denied", root + "/allowed/sub/secret.txt", fmt.Sprintf("/proc/%d", os.Getpid())}
	got, err := r.plan(read, readWrite, toolsDeny, quiet)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Plan(read, readWrite, toolsDeny, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("second plan through one resolver:\n got %v\nwant %v", got, want)
	}
	for _, rule := range got {
		if strings.HasPrefix(rule.Path, "/proc/") || rule.Path == root+"/allowed/sub" || rule.Path == root+"/allowed/sub/secret.txt" {
			t.Errorf("the tools' plan grants %s, which it denies", rule.Path)
		}
	}
}

// describe renders rules as "r|rw dir|file path-relative-to-root".
func describe(t *testing.T, root string, rules []Rule) []string {
	t.Helper()
	var got []string
	for _, r := range rules {
		access, kind := "r", "file"
		if r.Access == ReadWrite {
			access = "rw"
		}
		if r.Dir {
			kind = "dir"
		}
		rel, err := filepath.Rel(root, r.Path)
		if err != nil || strings.HasPrefix(rel, "..") {
			t.Fatalf("rule %+v lies outside the test tree", r)
		}
		got = append(got, access+" "+kind+" "+rel)
	}
	return got
}
