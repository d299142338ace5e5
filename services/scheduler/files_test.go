package scheduler

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
)

// stagedService is a Service with only what staging and placing files use.
func stagedService(t *testing.T) *Service {
	t.Helper()
	s := &Service{stateDir: t.TempDir()}
	s.cfg.Store(config.Defaults())
	return s
}

func fileOf(t *testing.T, name, body string) busapi.File {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return busapi.File{Name: name, Size: int64(len(body)), Open: f}
}

// A file whose bytes are not the size intake announced is refused and
// nothing is staged.
func TestStageFilesRefusesAWrongSizeAndLeavesNothing(t *testing.T) {
	s := stagedService(t)
	f := fileOf(t, "a.txt", "twelve bytes")
	f.Size = 5
	err := s.stageFiles("hooks/m1", []busapi.File{f})
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("stageFiles = %v, want ErrInvalidArgument", err)
	}
	ents, _ := os.ReadDir(filepath.Join(s.stateDir, "inbox"))
	if len(ents) != 0 {
		t.Fatalf("inbox/ holds %v after the refusal", ents)
	}
}

// The agent owns its workspace: an inbox it replaced by a symlink to a
// directory outside cannot make the scheduler (root) write there, and a
// file it planted under the message's directory is replaced.
func TestPlaceFilesStaysInsideTheWorkspace(t *testing.T) {
	s := stagedService(t)
	if err := s.stageFiles("hooks/m1", []busapi.File{fileOf(t, "a.txt", "hello")}); err != nil {
		t.Fatal(err)
	}
	r := Run{ID: "r1", MessageID: "hooks/m1", Connector: "hooks", Files: []RunFile{{Name: "a.txt", Size: 5}}}
	if err := s.stageFiles(r.MessageID, []busapi.File{fileOf(t, "a.txt", "hello")}); err != nil {
		t.Fatal(err)
	}
	ws, outside := t.TempDir(), t.TempDir()
	plan := isolation.Plan{Workspace: ws, SandboxWorkspace: "/workspace"}

	// The control: placed where it belongs, read-only, listed for the prompt.
	got, err := s.placeFiles(r, plan)
	if err != nil || len(got) != 1 || got[0].Path != "/workspace/inbox/m1/a.txt" {
		t.Fatalf("placeFiles = %+v, %v", got, err)
	}
	st, err := os.Stat(filepath.Join(ws, "inbox", "m1", "a.txt"))
	if err != nil || st.Mode().Perm() != 0o444 {
		t.Fatalf("placed file: %v, %v; want mode 0444", st, err)
	}
	if st, _ := os.Stat(filepath.Join(ws, "inbox", "m1")); st.Mode().Perm() != 0o555 {
		t.Errorf("the message's directory has mode %v, want 0555", st.Mode().Perm())
	}

	// The attack: inbox/ is now a symlink out of the workspace.
	if err := os.RemoveAll(filepath.Join(ws, "inbox")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(ws, "inbox")); err != nil {
		t.Fatal(err)
	}
	_, err = s.placeFiles(r, plan)
	if isolation.ReasonOf(err) != isolation.ReasonStart {
		t.Errorf("placeFiles through a symlink out = %v, want the run refused (%s)", err, isolation.ReasonStart)
	}
	ents, _ := os.ReadDir(outside)
	if len(ents) != 0 {
		t.Fatalf("the scheduler wrote outside the workspace: %v", ents)
	}

	// inbox/m1 a symlink to a directory outside, inside a real inbox/.
	os.Remove(filepath.Join(ws, "inbox"))
	os.MkdirAll(filepath.Join(ws, "inbox"), 0o755)
	os.Symlink(outside, filepath.Join(ws, "inbox", "m1"))
	if _, err := s.placeFiles(r, plan); err != nil {
		t.Fatalf("placeFiles over a planted symlink: %v (the symlink itself is removed, not followed)", err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("the scheduler wrote outside the workspace: %v", ents)
	}
	if fi, err := os.Lstat(filepath.Join(ws, "inbox", "m1")); err != nil || !fi.IsDir() {
		t.Fatalf("inbox/m1 is %v, %v; want the scheduler's directory", fi, err)
	}
}

// A kubernetes run's files are listed for its prompt and handed to its
// backend (podFiles), never placed in a host directory: the workspace is
// the pod's.
func TestPlaceFilesLeavesAKubernetesRunsFilesToItsBackend(t *testing.T) {
	s := stagedService(t)
	if err := s.stageFiles("hooks/m1", []busapi.File{fileOf(t, "a.txt", "hello")}); err != nil {
		t.Fatal(err)
	}
	r := Run{ID: "r1", MessageID: "hooks/m1", Connector: "hooks", Files: []RunFile{{Name: "a.txt", Size: 5}}}
	ws := t.TempDir()
	plan := isolation.Plan{Backend: isolation.BackendKubernetes, Workspace: ws, SandboxWorkspace: "/workspace"}
	got, err := s.placeFiles(r, plan)
	if err != nil || len(got) != 1 || got[0].Path != "/workspace/inbox/m1/a.txt" {
		t.Fatalf("placeFiles = %+v, %v; want the listing of /workspace/inbox/m1/a.txt", got, err)
	}
	if ents, _ := os.ReadDir(ws); len(ents) != 0 {
		t.Errorf("placeFiles wrote %v into a host directory for a kubernetes run", ents)
	}
	files, err := s.podFiles(s.cfg.Load(), r, plan)
	if err != nil || files == nil || files.InDir != "inbox/m1" || len(files.In) != 1 || files.In[0].Size != 5 || files.Out.File <= 0 {
		t.Fatalf("podFiles = %+v, %v; want a.txt's staged copy under inbox/m1 and the reply caps", files, err)
	}
	if data, err := os.ReadFile(files.In[0].Path); err != nil || len(data) != 5 {
		t.Errorf("the staged copy %s: %q, %v", files.In[0].Path, data, err)
	}
}
