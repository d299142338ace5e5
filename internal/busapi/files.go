package busapi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/godbus/dbus/v5"
)

// File is one attachment handed from one service to another: a message's
// file in (intake to the scheduler) or a reply's file out (the scheduler to
// intake). Its bytes travel as an open file descriptor (D-Bus type h), not
// as a path: the services run as different users, and a path chosen by the
// sender would let it make a root receiver read a file it cannot. The
// receiver reads Open from its start and closes it.
type File struct {
	// Name is the file's base name as the platform or the agent gave it
	// (CleanFileName makes it safe to use as one path element).
	Name string
	// Type is its media type ("" when unknown).
	Type string
	// Size is its length in bytes as the sender measured it; the receiver
	// checks it against what it reads.
	Size int64
	// Caption is what the agent said with a file it sends ("" for a file in).
	Caption string
	// Open is the open file; on the wire its descriptor.
	Open *os.File
}

// FileWire is one File on the wire: a(sssxh) — name, type, caption, size, fd.
type FileWire struct {
	Name    string
	Type    string
	Caption string
	Size    int64
	FD      dbus.UnixFD
}

// MaxFiles is the most files one message or reply carries on the bus.
const MaxFiles = 32

// FilesWire is files as a D-Bus argument. The descriptors stay the
// sender's: it closes its files once the call returned.
func FilesWire(files []File) []FileWire {
	w := make([]FileWire, len(files))
	for i, f := range files {
		w[i] = FileWire{Name: f.Name, Type: f.Type, Caption: f.Caption, Size: f.Size, FD: dbus.UnixFD(f.Open.Fd())}
	}
	return w
}

// FilesFromWire reads a files argument received from the bus. The files
// are the receiver's to close, also when it refuses them: on an error every
// descriptor received is closed already.
func FilesFromWire(w []FileWire) ([]File, error) {
	files := make([]File, 0, len(w))
	var err error
	for i, fw := range w {
		f := os.NewFile(uintptr(fw.FD), "attachment")
		if f == nil {
			err = errors.Join(err, fmt.Errorf("file %d: %w: no descriptor", i, ErrInvalid))
			continue
		}
		files = append(files, File{Name: fw.Name, Type: fw.Type, Caption: fw.Caption, Size: fw.Size, Open: f})
		if len(w) > MaxFiles {
			continue
		}
		if name, cerr := CleanFileName(fw.Name); cerr != nil || name != fw.Name {
			err = errors.Join(err, fmt.Errorf("file %d: %w: name %q is not a plain file name", i, ErrInvalid, fw.Name))
		}
		if fw.Size < 0 {
			err = errors.Join(err, fmt.Errorf("file %d: %w: size %d", i, ErrInvalid, fw.Size))
		}
	}
	if len(w) > MaxFiles {
		err = errors.Join(err, fmt.Errorf("%w: %d files, at most %d", ErrInvalid, len(w), MaxFiles))
	}
	if err != nil {
		CloseFiles(files)
		return nil, err
	}
	return files, nil
}

// CloseFiles closes every file's descriptor.
func CloseFiles(files []File) {
	for _, f := range files {
		if f.Open != nil {
			f.Open.Close()
		}
	}
}

// CleanFileName is name made safe as one path element: its base name
// only, control characters and path separators dropped, at most 200 bytes
// (cut at a character boundary, the extension kept). A name with nothing
// left ("", ".", "..") is an error.
func CleanFileName(name string) (string, error) {
	name = filepath.Base(strings.ReplaceAll(name, "\\", "/"))
	name = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == '/' || r == utf8.RuneError {
			return -1
		}
		return r
	}, name)
	name = strings.TrimSpace(name)
	if name == "" || name == "." || name == ".." {
		return "", fmt.Errorf("%w: no file name", ErrInvalid)
	}
	const maxName = 200
	if len(name) > maxName {
		ext := filepath.Ext(name)
		if len(ext) > 16 {
			ext = ""
		}
		stem := name[:maxName-len(ext)]
		for !utf8.ValidString(stem) {
			stem = stem[:len(stem)-1]
		}
		name = stem + ext
	}
	return name, nil
}

// WithNotes is text followed by one line per note, in parentheses: what a
// reply says of the files it could not carry.
func WithNotes(text string, notes []string) string {
	if len(notes) == 0 {
		return text
	}
	var b strings.Builder
	b.WriteString(strings.TrimRight(text, "\n"))
	for _, n := range notes {
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		b.WriteString("(" + n + ")")
	}
	return b.String()
}
