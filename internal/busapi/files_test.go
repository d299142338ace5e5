package busapi

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/godbus/dbus/v5"
)

func TestCleanFileName(t *testing.T) {
	for in, want := range map[string]string{
		"report.pdf":                      "report.pdf",
		"../../etc/passwd":                "passwd",
		`C:\Users\x\notes.txt`:            "notes.txt",
		"a\x00b\nc.txt":                   "abc.txt",
		" spaced.txt ":                    "spaced.txt",
		strings.Repeat("é", 150) + ".tar": strings.Repeat("é", 98) + ".tar",
	} {
		got, err := CleanFileName(in)
		if err != nil || got != want {
			t.Errorf("CleanFileName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", ".", "..", "/", "\x01\x02"} {
		if got, err := CleanFileName(in); !errors.Is(err, ErrInvalid) {
			t.Errorf("CleanFileName(%q) = %q, %v; want ErrInvalid", in, got, err)
		}
	}
}

// A received file whose name is not plain is refused, and every
// descriptor received is closed then (the receiver leaks none).
func TestFilesFromWireRefusesAndCloses(t *testing.T) {
	open := func() dbus.UnixFD {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		return dbus.UnixFD(f.Fd())
	}
	good, bad := open(), open()
	_, err := FilesFromWire([]FileWire{{Name: "ok.txt", FD: good}, {Name: "../x", FD: bad}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `"../x"`) {
		t.Fatalf("err = %v, want ErrInvalid naming ../x", err)
	}
	for _, fd := range []dbus.UnixFD{good, bad} {
		if _, err := os.NewFile(uintptr(fd), "x").Stat(); err == nil {
			t.Errorf("descriptor %d is still open after the refusal", fd)
		}
	}
	files, err := FilesFromWire([]FileWire{{Name: "ok.txt", Size: 0, FD: open()}})
	if err != nil || len(files) != 1 || files[0].Name != "ok.txt" {
		t.Fatalf("FilesFromWire = %v, %v", files, err)
	}
	CloseFiles(files)
}
