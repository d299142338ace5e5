package intake

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/durable"
	"github.com/berth-dev/berth/services/intake/connector"
)

// replyFilesDir is where intake keeps its copies of the files replies
// carry, beside intake.db:
//
//	reply-files/
//	├── <random>.<run id>/        one reply's files, renamed into place whole
//	│   ╰── <n>                   file n of the reply (0, 1, …), mode 0600
//	╰── .tmp-<random>.<run id>/   being written; never referenced
//
// An outbox entry names its directory (files_dir) and lists its files; the
// directory is in place and fsynced before the entry is committed, and is
// removed once the reply is delivered or failed, or, at the latest, by the
// retention pass, which also removes directories no pending reply names
// (left by a crash between the copy and the commit).
const replyFilesDir = "reply-files"

// storedFile is one file kept with an inbox message (attachments.go) or an
// outbox entry.
type storedFile struct {
	Name    string `json:"name"`
	Type    string `json:"type,omitempty"`
	Caption string `json:"caption,omitempty"`
	Size    int64  `json:"size"`
}

type replyFileStore struct {
	dir string
}

// save copies files into a new directory for runID and returns its name
// (relative to the store) once every byte is on disk. A file whose bytes
// are not Size long is refused (ErrInvalidReply).
func (rs replyFileStore) save(runID string, files []busapi.File) (dir string, stored []storedFile, err error) {
	if err := os.MkdirAll(rs.dir, 0o700); err != nil {
		return "", nil, fmt.Errorf("cannot store the reply's files: %w", err)
	}
	var suffix [6]byte
	_, _ = rand.Read(suffix[:])
	dir = hex.EncodeToString(suffix[:]) + "." + runID
	tmp := filepath.Join(rs.dir, ".tmp-"+dir)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return "", nil, fmt.Errorf("cannot store the reply's files: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	for i, f := range files {
		if err := copyFile(filepath.Join(tmp, fmt.Sprint(i)), f); err != nil {
			return "", nil, err
		}
		stored = append(stored, storedFile{Name: f.Name, Type: f.Type, Caption: f.Caption, Size: f.Size})
	}
	if err := durable.SyncDir(tmp); err != nil {
		return "", nil, err
	}
	if err := os.Rename(tmp, filepath.Join(rs.dir, dir)); err != nil {
		return "", nil, fmt.Errorf("cannot store the reply's files: %w", err)
	}
	if err := durable.SyncDir(rs.dir); err != nil {
		return "", nil, err
	}
	return dir, stored, nil
}

// copyFile writes f's bytes (read from its start, whatever the descriptor's
// offset) to path and fsyncs it.
func copyFile(path string, f busapi.File) error {
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("cannot store the reply's file %s: %w", f.Name, err)
	}
	defer out.Close()
	n, err := io.Copy(out, io.NewSectionReader(f.Open, 0, f.Size+1))
	if err != nil {
		return fmt.Errorf("cannot store the reply's file %s: %w", f.Name, err)
	}
	if n != f.Size {
		return fmt.Errorf("%w: file %s has %d bytes, not the %d its size says", ErrInvalidReply, f.Name, n, f.Size)
	}
	if err := out.Sync(); err != nil {
		return fmt.Errorf("cannot store the reply's file %s: %w", f.Name, err)
	}
	return out.Close()
}

// files are the connector.Files of an entry's stored files.
func (rs replyFileStore) files(dir string, stored []storedFile) []connector.File {
	if len(stored) == 0 {
		return nil
	}
	out := make([]connector.File, len(stored))
	for i, f := range stored {
		out[i] = connector.File{Name: f.Name, Type: f.Type, Caption: f.Caption, Size: f.Size,
			Path: filepath.Join(rs.dir, dir, fmt.Sprint(i))}
	}
	return out
}

// remove deletes one reply's directory ("" is none).
func (rs replyFileStore) remove(dir string) error {
	if dir == "" || strings.ContainsAny(dir, `/\`) || dir == "." || dir == ".." {
		return nil
	}
	if err := os.RemoveAll(filepath.Join(rs.dir, dir)); err != nil {
		return fmt.Errorf("cannot remove the reply's files: %w", err)
	}
	return nil
}

// sweep removes every directory that keep does not name: those of replies
// done or gone, and temporary ones older than an hour (one being written
// now is younger). It returns how many it removed.
func (rs replyFileStore) sweep(keep func(dir string) bool, now time.Time, log *slog.Logger) int {
	entries, err := os.ReadDir(rs.dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		log.Error("cannot sweep the replies' files", "err", err)
		return 0
	}
	removed := 0
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".tmp-") {
			if info, err := e.Info(); err != nil || now.Sub(info.ModTime()) < time.Hour {
				continue
			}
		} else if keep(name) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(rs.dir, name)); err != nil {
			log.Error("cannot remove the files of a finished reply", "dir", name, "err", err)
			continue
		}
		removed++
	}
	return removed
}
