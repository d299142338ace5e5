package scheduler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/durable"
	"github.com/berth-dev/berth/isolation"
)

// A message's files (issue 26). SubmitFiles copies them from the
// descriptors intake passed into <state>/inbox/<digest of the message key>/
// (fsynced, renamed into place) before the run is committed, so the run
// never depends on intake's copy. Each attempt of the run places them
// read-only in the agent's workspace under inbox/<message id>/ (placeFiles)
// and the agent's prompt lists them. The staged copy is deleted with the
// run record (retention).

// RunFile is one file of a run's message, as its record keeps it.
type RunFile struct {
	Name string `json:"name"`
	Type string `json:"type,omitempty"`
	Size int64  `json:"size"`
}

// inboxDir is where the message key's files are staged.
func (s *Service) inboxDir(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(s.stateDir, "inbox", hex.EncodeToString(sum[:16]))
}

// SubmitFiles is Submit for a message with files: the files are copied
// before the run is committed. The caller closes msg.Files. The same
// message returns its run as Submit does, and copies nothing again.
func (s *Service) SubmitFiles(msg busapi.Submission) (string, error) {
	if err := checkMessage(msg); err != nil {
		return "", err
	}
	if id, ok, err := s.runOfMessage(msg.Key()); err != nil || ok {
		return id, err
	}
	limits := s.cfg.Load().Intake
	perFile, total := limits.AttachmentLimit(), limits.MessageAttachmentLimit()
	var sum int64
	for _, f := range msg.Files {
		if f.Size > perFile {
			return "", fmt.Errorf("%w: file %s is %d bytes, above [intake] max_attachment_bytes (%d)", ErrInvalidArgument, f.Name, f.Size, perFile)
		}
		if sum += f.Size; sum > total {
			return "", fmt.Errorf("%w: the message's files are above [intake] max_message_attachment_bytes (%d)", ErrInvalidArgument, total)
		}
	}
	if err := s.stageFiles(msg.Key(), msg.Files); err != nil {
		return "", err
	}
	return s.Submit(msg)
}

// runOfMessage is the run a message key was already submitted as.
func (s *Service) runOfMessage(key string) (string, bool, error) {
	var id string
	err := s.store.db.View(func(tx *bolt.Tx) error {
		id = string(messagesBucket(tx).Get([]byte(key)))
		return nil
	})
	return id, id != "", err
}

// stageFiles copies files into the key's inbox directory, each exactly
// the size intake announced.
func (s *Service) stageFiles(key string, files []busapi.File) error {
	root := filepath.Join(s.stateDir, "inbox")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("cannot stage the message's files: %w", err)
	}
	tmp, err := os.MkdirTemp(root, ".in-")
	if err != nil {
		return fmt.Errorf("cannot stage the message's files: %w", err)
	}
	kept := false
	defer func() {
		if !kept {
			os.RemoveAll(tmp)
		}
	}()
	seen := map[string]bool{}
	for _, f := range files {
		if seen[f.Name] {
			return fmt.Errorf("%w: two files named %q", ErrInvalidArgument, f.Name)
		}
		seen[f.Name] = true
		if err := copyExactly(filepath.Join(tmp, f.Name), f.Open, f.Size, 0o600); err != nil {
			return fmt.Errorf("file %s: %w", f.Name, err)
		}
	}
	if err := durable.SyncDir(tmp); err != nil {
		return err
	}
	dst := s.inboxDir(key)
	// Left by a crash between the copy and the run's commit.
	if err := os.RemoveAll(dst); err != nil {
		return fmt.Errorf("cannot stage the message's files: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("cannot stage the message's files: %w", err)
	}
	kept = true
	return durable.SyncDir(root)
}

// copyExactly writes size bytes of src to a new file dst (fsynced): fewer
// or more is an invalid argument.
func copyExactly(dst string, src io.Reader, size int64, mode fs.FileMode) error {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	defer out.Close()
	n, err := io.Copy(out, io.LimitReader(src, size+1))
	if err != nil {
		return fmt.Errorf("cannot copy: %w", err)
	}
	if n != size {
		return fmt.Errorf("%w: %d bytes where %d were announced", ErrInvalidArgument, n, size)
	}
	if err := out.Sync(); err != nil {
		return err
	}
	return out.Close()
}

// inboxName is the directory a message's files get in the workspace: the
// platform's message id made one path element.
func inboxName(r Run) string {
	name, err := busapi.CleanFileName(busapi.MessageIDOf(r.Connector, r.MessageID))
	if err != nil {
		return r.ID
	}
	return name
}

// placeFiles puts run r's files read-only in the workspace of plan, under
// inbox/<message id>/ (owned by the scheduler, mode 0555 and 0444: the
// agent reads them and cannot change them), and returns them as the
// agent's prompt lists them. The workspace is the agent's: it is entered
// through os.Root, so a symlink the agent left there cannot send the copy
// outside it. A pod's workspace is not on this host: its backend places
// the files (podFiles), and placeFiles only lists them.
func (s *Service) placeFiles(r Run, plan isolation.Plan) ([]agentproto.MessageFile, error) {
	if len(r.Files) == 0 {
		return nil, nil
	}
	if plan.Backend == isolation.BackendKubernetes {
		return listFiles(r, plan), nil
	}
	ws, err := os.OpenRoot(plan.Workspace)
	if err != nil {
		return nil, placeError(err)
	}
	defer ws.Close()
	if err := ws.MkdirAll("inbox", 0o755); err != nil {
		return nil, placeError(err)
	}
	dir := filepath.Join("inbox", inboxName(r))
	// An earlier attempt's copy (or whatever the agent put there) goes.
	if err := ws.RemoveAll(dir); err != nil {
		return nil, placeError(err)
	}
	if err := ws.Mkdir(dir, 0o755); err != nil {
		return nil, placeError(err)
	}
	staged := s.inboxDir(r.MessageID)
	out := make([]agentproto.MessageFile, 0, len(r.Files))
	for _, f := range r.Files {
		if err := placeOne(ws, filepath.Join(staged, f.Name), filepath.Join(dir, f.Name), f.Size); err != nil {
			return nil, placeError(fmt.Errorf("file %s: %w", f.Name, err))
		}
		out = append(out, agentproto.MessageFile{
			Path: filepath.Join(plan.SandboxWorkspace, dir, f.Name),
			Name: f.Name, Type: f.Type, Size: f.Size,
		})
	}
	if err := ws.Chmod(dir, 0o555); err != nil {
		return nil, placeError(err)
	}
	return out, nil
}

// listFiles is the prompt's listing of run r's files under inbox/<message id>/.
func listFiles(r Run, plan isolation.Plan) []agentproto.MessageFile {
	dir := filepath.Join("inbox", inboxName(r))
	out := make([]agentproto.MessageFile, 0, len(r.Files))
	for _, f := range r.Files {
		out = append(out, agentproto.MessageFile{Path: filepath.Join(plan.SandboxWorkspace, dir, f.Name), Name: f.Name, Type: f.Type, Size: f.Size})
	}
	return out
}

// podFiles are the files a kubernetes run's backend moves (ADR 29): the
// message's staged files, which it places in the pod's workspace before
// the request, and the caps of the reply's files it reads back after the
// response (none when no connector waits for the reply). Other backends
// get nil: the scheduler reaches their workspace itself.
func (s *Service) podFiles(cfg *config.Config, r Run, plan isolation.Plan) (*isolation.RunFiles, error) {
	if plan.Backend != isolation.BackendKubernetes {
		return nil, nil
	}
	files := &isolation.RunFiles{InDir: filepath.Join("inbox", inboxName(r))}
	if r.Connector != "" {
		files.Out = replyCaps(cfg)
	}
	staged := s.inboxDir(r.MessageID)
	for _, f := range r.Files {
		p := filepath.Join(staged, f.Name)
		if fi, err := os.Stat(p); err != nil {
			return nil, placeError(fmt.Errorf("file %s: %w", f.Name, err))
		} else if fi.Size() != f.Size {
			return nil, placeError(fmt.Errorf("file %s: the staged copy has %d bytes, not %d", f.Name, fi.Size(), f.Size))
		}
		files.In = append(files.In, isolation.InFile{Name: f.Name, Size: f.Size, Path: p})
	}
	return files, nil
}

func placeOne(ws *os.Root, src, dst string, size int64) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := ws.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return err
	}
	defer out.Close()
	if n, err := io.Copy(out, io.LimitReader(in, size+1)); err != nil {
		return err
	} else if n != size {
		return fmt.Errorf("the staged copy has %d bytes, not %d", n, size)
	}
	// The mode given to OpenFile passed through the umask.
	if err := out.Chmod(0o444); err != nil {
		return err
	}
	return out.Close()
}

func placeError(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		err = fmt.Errorf("%w (the staged copy is gone)", err)
	}
	return &isolation.RunError{Reason: isolation.ReasonStart, Detail: "cannot place the message's files in the workspace", Err: err}
}

// dropStaged deletes the staged files of messages whose runs are deleted.
func (s *Service) dropStaged(keys []string) {
	for _, k := range keys {
		if err := os.RemoveAll(s.inboxDir(k)); err != nil {
			s.log.Warn("cannot delete a pruned run's staged files", "message_id", k, "err", err)
		}
	}
}

// runKept runs req in a kept sandbox, handing a pod's backend the run's
// files (podFiles); a kept pod that cannot take them fails the run.
func (s *Service) runKept(ctx context.Context, cfg *config.Config, r Run, kept isolation.Kept, plan isolation.Plan, req agentproto.Request) (isolation.Result, error) {
	files, err := s.podFiles(cfg, r, plan)
	if err != nil || files == nil {
		if err != nil {
			return isolation.Result{}, err
		}
		return kept.Run(ctx, req)
	}
	fk, ok := kept.(isolation.FilesKeeper)
	if !ok {
		if len(files.In) > 0 {
			return isolation.Result{}, &isolation.RunError{Reason: isolation.ReasonStart,
				Detail: "this conversation's sandbox cannot take the message's files; the run is refused rather than run without them"}
		}
		return kept.Run(ctx, req)
	}
	return fk.RunWithFiles(ctx, req, files)
}
