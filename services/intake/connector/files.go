package connector

import (
	"fmt"
	"os"
	"strings"

	"github.com/berth-dev/berth/internal/busapi"
)

// File is one upload of a Reply: intake's own copy of a file the agent
// sent (services/intake keeps it until the reply is done).
type File struct {
	Name    string // one safe path element (busapi.CleanFileName)
	Type    string // media type; "application/octet-stream" when unknown
	Caption string // what the agent said with it; may be ""
	Size    int64
	// Path is intake's copy; Open reads it.
	Path string
}

// Open opens the file's bytes for reading.
func (f File) Open() (*os.File, error) {
	r, err := os.Open(f.Path)
	if err != nil {
		return nil, fmt.Errorf("cannot open the reply's file %s: %w", f.Name, err)
	}
	return r, nil
}

// FileLimits are what one platform takes.
type FileLimits struct {
	Platform string // "Slack", for the notes
	// MaxFileBytes is the largest file the platform takes.
	MaxFileBytes int64
	// RefuseEmpty says the platform takes no empty file.
	RefuseEmpty bool
}

// FitFiles keeps the files within limits, in order, and returns a note for
// each one left out, to go into the reply's text (WithNotes): a reply is
// never refused for a file the platform would not take.
func FitFiles(files []File, l FileLimits) (fit []File, notes []string) {
	for _, f := range files {
		if l.RefuseEmpty && f.Size == 0 {
			notes = append(notes, fmt.Sprintf("%s was not sent: it is empty, and %s takes no empty file", f.Name, l.Platform))
			continue
		}
		if l.MaxFileBytes > 0 && f.Size > l.MaxFileBytes {
			notes = append(notes, fmt.Sprintf("%s was not sent: it is %s, more than the %s %s takes", f.Name, HumanBytes(f.Size), HumanBytes(l.MaxFileBytes), l.Platform))
			continue
		}
		fit = append(fit, f)
	}
	return fit, notes
}

// WithNotes is text followed by one line per note, in parentheses (as the
// scheduler writes its own notes into a reply: busapi.WithNotes).
func WithNotes(text string, notes []string) string { return busapi.WithNotes(text, notes) }

// FileCaptions is the text that goes with a batch of files: one
// "name: caption" line per file that has a caption.
func FileCaptions(files []File) string {
	var lines []string
	for _, f := range files {
		if f.Caption != "" {
			lines = append(lines, f.Name+": "+f.Caption)
		}
	}
	return strings.Join(lines, "\n")
}

// HumanBytes is n as "25 MiB", "512 KiB" or "12 bytes".
func HumanBytes(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
