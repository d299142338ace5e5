package filestamp_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/filestamp"
)

func TestAStampChangesWhenTheFileDoes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(t *testing.T, path string)
		same   bool
	}{
		{name: "An_untouched_file_keeps_its_stamp", change: func(*testing.T, string) {}, same: true},
		{name: "A_file_grown_in_place_gets_another_stamp", change: func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteString("more"); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "A_file_replaced_by_rename_gets_another_stamp", change: func(t *testing.T, path string) {
			next := path + ".new"
			if err := os.WriteFile(next, []byte("v1"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(next, path); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "f")
			if err := os.WriteFile(path, []byte("v1"), 0o644); err != nil {
				t.Fatal(err)
			}
			before, err := filestamp.Of(path)
			if err != nil {
				t.Fatal(err)
			}
			tt.change(t, path)
			after, err := filestamp.Of(path)
			if err != nil {
				t.Fatal(err)
			}
			if (before == after) != tt.same {
				t.Errorf("stamp before %+v, after %+v; want same=%v", before, after, tt.same)
			}
		})
	}
}

func TestAMissingFileIsANotExistErrorThatNamesIt(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "absent")
	_, err := filestamp.Of(path)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("error %v, want one that is fs.ErrNotExist", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name %s", err, path)
	}
}
