package runprep

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/isolation"
)

// fakeUserFiles is a user database in two temp files and a lookup that
// reads it ("name:uid" lines) and counts its calls.
type fakeUserFiles struct {
	passwd, group string
	lookups       int
}

func newFakeUserFiles(t *testing.T, passwd string) *fakeUserFiles {
	t.Helper()
	dir := t.TempDir()
	f := &fakeUserFiles{passwd: filepath.Join(dir, "passwd"), group: filepath.Join(dir, "group")}
	f.write(t, f.passwd, passwd)
	f.write(t, f.group, "berth-egress:990\n")
	return f
}

// write replaces path as useradd does (a new file renamed into place).
func (f *fakeUserFiles) write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path+".new", []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

func (f *fakeUserFiles) lookup(name string) (*isolation.RunUser, error) {
	f.lookups++
	data, err := os.ReadFile(f.passwd)
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if n, uid, ok := strings.Cut(line, ":"); ok && n == name {
			return &isolation.RunUser{Name: n, UID: uint32(len(uid)), Groups: []uint32{1}}, nil
		}
	}
	return nil, errors.New("unknown user " + name)
}

func (f *fakeUserFiles) cache(now func() time.Time) *userCache {
	return &userCache{lookup: f.lookup, files: []string{f.passwd, f.group}, now: now, enabled: true}
}

func TestRunUserLookups(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name        string
		enabled     bool
		between     func(t *testing.T, f *fakeUserFiles, now *time.Time)
		wantLookups int
		wantErr     bool
	}{
		{"A_second_lookup_with_the_user_files_unchanged_is_answered_from_the_cache", true,
			func(*testing.T, *fakeUserFiles, *time.Time) {}, 1, false},
		{"A_user_removed_from_passwd_is_not_found_at_the_next_lookup", true,
			func(t *testing.T, f *fakeUserFiles, _ *time.Time) { f.write(t, f.passwd, "root:0\n") }, 2, true},
		{"A_changed_group_file_is_read_again", true,
			func(t *testing.T, f *fakeUserFiles, _ *time.Time) { f.write(t, f.group, "berth-egress:990:ann\n") }, 2, false},
		{"An_answer_is_not_kept_past_its_age", true,
			func(_ *testing.T, _ *fakeUserFiles, now *time.Time) { *now = now.Add(userCacheMaxAge) }, 2, false},
		{"Where_users_come_from_NSS_every_lookup_asks", false,
			func(*testing.T, *fakeUserFiles, *time.Time) {}, 2, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeUserFiles(t, "root:0\nberth-egress:990\n")
			now := t0
			c := f.cache(func() time.Time { return now })
			c.enabled = tc.enabled
			u, err := c.Lookup("berth-egress")
			if err != nil || u.Name != "berth-egress" {
				t.Fatalf("first lookup = %+v, %v", u, err)
			}
			u.Groups[0] = 42 // the caller's copy
			tc.between(t, f, &now)
			u, err = c.Lookup("berth-egress")
			if (err != nil) != tc.wantErr {
				t.Fatalf("second lookup = %+v, %v; want an error: %v", u, err, tc.wantErr)
			}
			if err == nil && u.Groups[0] != 1 {
				t.Fatalf("second lookup's groups %v: a caller changed the cached user", u.Groups)
			}
			if f.lookups != tc.wantLookups {
				t.Fatalf("%d lookups of the user files; want %d", f.lookups, tc.wantLookups)
			}
		})
	}
}

func TestRunUserAddedAfterAFailedLookupIsFoundAtTheNextOne(t *testing.T) {
	t.Parallel()
	f := newFakeUserFiles(t, "root:0\n")
	c := f.cache(time.Now)
	if _, err := c.Lookup("berth-egress"); err == nil {
		t.Fatal("found a user that is not there")
	}
	if _, err := c.Lookup("berth-egress"); err == nil || f.lookups != 1 {
		t.Fatalf("second lookup: %v after %d lookups; want the cached refusal", err, f.lookups)
	}
	f.write(t, f.passwd, "root:0\nberth-egress:990\n")
	if u, err := c.Lookup("berth-egress"); err != nil || u.Name != "berth-egress" {
		t.Fatalf("after useradd: %+v, %v", u, err)
	}
}

// BenchmarkRunUserLookup is what a run's host facts pay to look up
// [scheduler] egress_user: os/user's own parse of /etc/passwd and
// /etc/group (a build without cgo, as berth ships), or the cache.
func BenchmarkRunUserLookup(b *testing.B) {
	for _, cached := range []bool{false, true} {
		b.Run(map[bool]string{false: "lookup", true: "cached"}[cached], func(b *testing.B) {
			c := &userCache{lookup: isolation.LookupRunUser, files: userDatabases, now: time.Now, enabled: cached}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Lookup("nobody"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
