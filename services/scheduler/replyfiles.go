package scheduler

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/durable"
	"github.com/berth-dev/berth/isolation"
)

// The files a reply carries (agentproto.Response.Files) are read from the
// agent's workspace on the host after the run and copied into the
// scheduler's state before the run's outcome is recorded, so that a
// delivery retried after a crash still has them:
//
//	<state>/reply-files/<run id>/<n>   file n of the run's reply, 0600, root's
//
// Run.ReplyFiles lists them (name, type, caption, size); the directory goes
// once intake has its own copy (DeliverFiles returned), or with the run.
//
// The agent controls the workspace, so every path is opened beneath it with
// openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS|
// RESOLVE_NO_XDEV) and O_PATH first: no symlink anywhere on the path is
// followed, nothing outside the workspace is reached, and nothing but a
// regular file is ever opened for reading (a FIFO would block, a device
// could act on the open). A file with more than one hard link is refused: the
// agent's uid can link a file it cannot read only where
// fs.protected_hardlinks is off, but then the link would carry root's read.
const replyFilesDir = "reply-files"

// ReplyFile is one file of a run's reply as the record keeps it.
type ReplyFile struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Caption string `json:"caption,omitempty"`
	Size    int64  `json:"size"`
}

// replyFileCaps bound what one reply carries.
type replyFileCaps struct {
	file, total int64
}

// takenFiles is what collectReplyFiles kept of a reply's files, and a note
// for each one it left out (they go into the reply's text).
type takenFiles struct {
	files []ReplyFile
	notes []string
}

// runOutcome is what a run returned, and the reply's files taken from its
// workspace.
type runOutcome struct {
	isolation.Result
	files takenFiles
}

// takeReplyFiles copies the files a succeeded run's reply carries into the
// scheduler's state (collectReplyFiles). A run no connector asked for has
// no one to send them to; a run whose workspace is not on this host
// (kubernetes) cannot send them yet, and says so in its reply.
func (s *Service) takeReplyFiles(cfg *config.Config, r Run, plan isolation.Plan, secrets []string, resp agentproto.Response) takenFiles {
	if len(resp.Files) == 0 || resp.Error != "" || r.Connector == "" {
		return takenFiles{}
	}
	if plan.Backend == isolation.BackendKubernetes {
		return takenFiles{notes: []string{"the files were not sent: a Kubernetes run's workspace is not on the scheduler's host"}}
	}
	caps := replyFileCaps{file: cfg.Scheduler.MaxReplyFileBytes, total: cfg.Scheduler.MaxReplyFilesBytes}
	if caps.file <= 0 {
		caps.file = config.DefaultMaxReplyFileBytes
	}
	if caps.total <= 0 {
		caps.total = config.DefaultMaxReplyFilesBytes
	}
	taken, err := collectReplyFiles(plan.Workspace, resp.Files, secrets, caps, s.replyFilesPath(r.ID))
	if err != nil {
		s.runLog(r).Error("cannot take the reply's files; the reply goes without them", "err", err)
		return takenFiles{notes: []string{"the files were not sent: the scheduler could not store them"}}
	}
	for _, n := range taken.notes {
		s.runLog(r).Warn("a file of the reply was left out", "note", n)
	}
	return taken
}

// removeReplyFiles deletes run id's stored files: intake has them, or the
// run is gone.
func (s *Service) removeReplyFiles(id string) {
	if id == "" || strings.ContainsAny(id, "/\\") || id == "." || id == ".." {
		return
	}
	if err := os.RemoveAll(s.replyFilesPath(id)); err != nil {
		s.log.Warn("cannot remove the files of a delivered reply", "run_id", id, "err", err)
	}
}

// replyFilesPath is the directory of run id's files.
func (s *Service) replyFilesPath(runID string) string {
	return filepath.Join(s.stateDir, replyFilesDir, runID)
}

// collectReplyFiles copies the files of a reply from workspace (the host
// path of the run's workspace) into dest, redacting secrets in text files,
// within caps, and removes the files it read from the workspace's outbox/.
// A file it cannot or may not take gets a note; an error means dest could
// not be written (the run keeps its reply without files).
func collectReplyFiles(workspace string, want []agentproto.OutFile, secrets []string, caps replyFileCaps, dest string) (taken takenFiles, err error) {
	if err := os.RemoveAll(dest); err != nil {
		return takenFiles{}, fmt.Errorf("cannot clear the reply's files: %w", err)
	}
	if len(want) == 0 {
		return takenFiles{}, nil
	}
	if err := os.MkdirAll(dest, 0o700); err != nil {
		return takenFiles{}, fmt.Errorf("cannot store the reply's files: %w", err)
	}
	ws, err := unix.Open(workspace, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return takenFiles{}, fmt.Errorf("cannot open the workspace %s: %w", workspace, err)
	}
	defer unix.Close(ws)
	var total int64
	seen := map[string]bool{}
	for i, f := range want {
		if i >= agentproto.MaxOutFiles {
			taken.notes = append(taken.notes, fmt.Sprintf("%d more files were not sent: a reply carries at most %d", len(want)-i, agentproto.MaxOutFiles))
			break
		}
		rel := path.Clean(f.Path)
		if seen[rel] {
			continue
		}
		seen[rel] = true
		name, nerr := busapi.CleanFileName(path.Base(rel))
		if nerr != nil {
			name = "file"
		}
		data, note := readWorkspaceFile(ws, rel, caps.file)
		if strings.HasPrefix(rel, agentproto.OutboxDir+"/") && !strings.Contains(strings.TrimPrefix(rel, agentproto.OutboxDir+"/"), "/") {
			removeFromOutbox(ws, path.Base(rel))
		}
		if note != "" {
			taken.notes = append(taken.notes, name+" was not sent: "+note)
			continue
		}
		if total+int64(len(data)) > caps.total {
			taken.notes = append(taken.notes, fmt.Sprintf("%s was not sent: the reply's files would pass the %s all of them may have (max_reply_files_bytes)", name, humanBytes(caps.total)))
			continue
		}
		typ := mediaType(name, data)
		if data, note = redactFile(data, secrets); note != "" {
			taken.notes = append(taken.notes, name+" was not sent: "+note)
			continue
		}
		if err := writeWhole(filepath.Join(dest, strconv.Itoa(len(taken.files))), data); err != nil {
			return takenFiles{}, err
		}
		total += int64(len(data))
		taken.files = append(taken.files, ReplyFile{Name: name, Type: typ, Caption: cleanText(f.Caption), Size: int64(len(data))})
	}
	if err := durable.SyncDir(dest); err != nil {
		return takenFiles{}, err
	}
	return taken, nil
}

// readWorkspaceFile reads rel beneath the workspace ws, at most limit bytes;
// note says why it was not read.
func readWorkspaceFile(ws int, rel string, limit int64) ([]byte, string) {
	if rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || path.IsAbs(rel) {
		return nil, "its path is not inside the workspace"
	}
	fd, err := unix.Openat2(ws, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, "it does not exist"
	case errors.Is(err, unix.ELOOP):
		return nil, "it is a symbolic link, or its path goes through one"
	case errors.Is(err, unix.EXDEV):
		return nil, "its path leaves the workspace"
	case err != nil:
		return nil, fmt.Sprintf("it cannot be opened (%v)", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Sprintf("it cannot be read (%v)", err)
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return nil, "it is a symbolic link, or its path goes through one"
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, "it is not a regular file"
	case st.Nlink > 1:
		return nil, "it has more than one hard link"
	case st.Size > limit:
		return nil, fmt.Sprintf("it is %s, more than the %s a file may have (max_reply_file_bytes)", humanBytes(st.Size), humanBytes(limit))
	}
	// Reopening the O_PATH descriptor reads the very inode just checked.
	f, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fd), os.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Sprintf("it cannot be read (%v)", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Sprintf("it cannot be read (%v)", err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Sprintf("it grew past the %s a file may have (max_reply_file_bytes)", humanBytes(limit))
	}
	return data, ""
}

// removeFromOutbox unlinks name in the workspace's outbox/ (never following
// a symlink): a file left there goes out with one reply only.
func removeFromOutbox(ws int, name string) {
	dir, err := unix.Openat2(ws, agentproto.OutboxDir, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return
	}
	defer unix.Close(dir)
	_ = unix.Unlinkat(dir, name, 0)
}

// redactFile replaces every known secret in a text file (valid UTF-8
// without NUL) with isolation.Redacted; a binary file holding one cannot be
// redacted without breaking it, so it is refused (note).
func redactFile(data []byte, secrets []string) ([]byte, string) {
	found := false
	for _, s := range secrets {
		if bytes.Contains(data, []byte(s)) {
			found = true
			break
		}
	}
	if !found {
		return data, ""
	}
	if !utf8.Valid(data) || bytes.IndexByte(data, 0) >= 0 {
		return nil, "it holds a secret berth redacts, and a binary file cannot be redacted"
	}
	for _, s := range secrets {
		data = bytes.ReplaceAll(data, []byte(s), []byte(isolation.Redacted))
	}
	return data, ""
}

// mediaType is the file's type by its extension, else by its first bytes.
func mediaType(name string, data []byte) string {
	if t := mime.TypeByExtension(filepath.Ext(name)); t != "" {
		return t
	}
	return http.DetectContentType(data)
}

// writeWhole writes data to path through a temporary file, fsynced and
// renamed: the path holds all of it or nothing.
func writeWhole(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("cannot store the reply's file: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("cannot store the reply's file: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("cannot store the reply's file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("cannot store the reply's file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("cannot store the reply's file: %w", err)
	}
	return nil
}

// openReplyFiles opens the stored files of run r for DeliverFiles; the
// caller closes them (busapi.CloseFiles).
func (s *Service) openReplyFiles(r Run) ([]busapi.File, error) {
	files := make([]busapi.File, 0, len(r.ReplyFiles))
	for i, rf := range r.ReplyFiles {
		f, err := os.Open(filepath.Join(s.replyFilesPath(r.ID), strconv.Itoa(i)))
		if err != nil {
			busapi.CloseFiles(files)
			return nil, fmt.Errorf("cannot open the reply's file %s: %w", rf.Name, err)
		}
		files = append(files, busapi.File{Name: rf.Name, Type: rf.Type, Caption: rf.Caption, Size: rf.Size, Open: f})
	}
	return files, nil
}

func humanBytes(n int64) string {
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
