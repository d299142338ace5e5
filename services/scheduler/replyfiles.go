package scheduler

import (
	"bytes"
	"fmt"
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
	"github.com/berth-dev/berth/internal/workspacefile"
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
// The agent controls the workspace, so every path is read as package
// workspacefile reads it (beneath, no symlink, regular files only, one hard
// link); a kubernetes run's files were read that way by berth-agent's
// files-out helper in the pod, and only their bytes and refusal codes came
// back (ADR 29).
const replyFilesDir = "reply-files"

// ReplyFile is one file of a run's reply as the record keeps it.
type ReplyFile struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Caption string `json:"caption,omitempty"`
	Size    int64  `json:"size"`
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
// no one to send them to. A kubernetes run's workspace is not on this
// host: its backend read the files from the pod (res.ReplyFiles, ADR 29)
// and they pass the same caps and redaction here.
func (s *Service) takeReplyFiles(cfg *config.Config, r Run, plan isolation.Plan, secrets []string, res isolation.Result) takenFiles {
	resp := res.Response
	if len(resp.Files) == 0 || resp.Error != "" || r.Connector == "" {
		return takenFiles{}
	}
	var src replySource
	if plan.Backend == isolation.BackendKubernetes {
		src = podSource(res.ReplyFiles)
	} else {
		ws, err := workspacefile.Open(plan.Workspace)
		if err != nil {
			s.runLog(r).Error("cannot take the reply's files; the reply goes without them", "err", err)
			return takenFiles{notes: []string{"the files were not sent: the scheduler could not open the workspace"}}
		}
		defer unix.Close(ws)
		src = hostSource(ws)
	}
	taken, err := collectReplyFiles(src, resp.Files, secrets, replyCaps(cfg), s.replyFilesPath(r.ID))
	if err != nil {
		s.runLog(r).Error("cannot take the reply's files; the reply goes without them", "err", err)
		return takenFiles{notes: []string{"the files were not sent: the scheduler could not store them"}}
	}
	for _, n := range taken.notes {
		s.runLog(r).Warn("a file of the reply was left out", "note", n)
	}
	return taken
}

// replyCaps are [scheduler] max_reply_file_bytes and max_reply_files_bytes.
func replyCaps(cfg *config.Config) isolation.FileCaps {
	caps := isolation.FileCaps{File: cfg.Scheduler.MaxReplyFileBytes, Total: cfg.Scheduler.MaxReplyFilesBytes}
	if caps.File <= 0 {
		caps.File = config.DefaultMaxReplyFileBytes
	}
	if caps.Total <= 0 {
		caps.Total = config.DefaultMaxReplyFilesBytes
	}
	return caps
}

// replySource is where a reply's files are read: a workspace on this host,
// or what a pod's files-out helper sent (ADR 29).
type replySource interface {
	// read is rel's bytes, at most limit, or why not.
	read(rel string, limit int64) ([]byte, *workspacefile.Refusal, string)
	// taken says rel was read: a file directly in outbox/ goes out once.
	taken(rel string)
}

// hostSource reads beneath a workspace directory on this host.
type hostSource int

func (ws hostSource) read(rel string, limit int64) ([]byte, *workspacefile.Refusal, string) {
	data, refused := workspacefile.Read(int(ws), rel, limit)
	return data, refused, ""
}

func (ws hostSource) taken(rel string) {
	if name, ok := workspacefile.OutboxName(rel); ok {
		workspacefile.RemoveFromOutbox(int(ws), name)
	}
}

// podSource is what the backend read from a pod: the helper already
// removed what it sent from outbox/. Nothing it says is taken on trust: a
// refusal is decoded from its code, a file is held to the caps again.
type podSource []isolation.SandboxFile

func (p podSource) read(rel string, limit int64) ([]byte, *workspacefile.Refusal, string) {
	for _, f := range p {
		if path.Clean(f.Path) != rel {
			continue
		}
		switch {
		case f.Failed != "":
			return nil, nil, f.Failed
		case f.Refusal != "":
			r := workspacefile.Decode(f.Refusal)
			return nil, &r, ""
		case int64(len(f.Data)) > limit:
			return nil, &workspacefile.Refusal{Why: workspacefile.TooLarge, Size: int64(len(f.Data)), Limit: limit}, ""
		}
		return f.Data, nil, ""
	}
	return nil, nil, "the pod was not asked for it"
}

func (podSource) taken(string) {}

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

// collectReplyFiles copies the files of a reply from src into dest,
// redacting secrets in text files, within caps, and removes the files it
// read from the workspace's outbox/. A file it cannot or may not take gets
// a note; an error means dest could not be written (the run keeps its reply
// without files).
func collectReplyFiles(src replySource, want []agentproto.OutFile, secrets []string, caps isolation.FileCaps, dest string) (taken takenFiles, err error) {
	if err := os.RemoveAll(dest); err != nil {
		return takenFiles{}, fmt.Errorf("cannot clear the reply's files: %w", err)
	}
	if len(want) == 0 {
		return takenFiles{}, nil
	}
	if err := os.MkdirAll(dest, 0o700); err != nil {
		return takenFiles{}, fmt.Errorf("cannot store the reply's files: %w", err)
	}
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
		data, refused, failed := src.read(rel, caps.File)
		src.taken(rel)
		switch {
		case failed != "":
			taken.notes = append(taken.notes, name+" was not sent: "+failed)
			continue
		case refused != nil:
			taken.notes = append(taken.notes, name+" was not sent: "+refused.Note())
			continue
		}
		if total+int64(len(data)) > caps.Total {
			taken.notes = append(taken.notes, name+" was not sent: "+workspacefile.Refusal{Why: workspacefile.OverTotal, Limit: caps.Total}.Note())
			continue
		}
		typ := mediaType(name, data)
		var note string
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
