package kube_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/workspacefile"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/kube"
)

// stagedFile is a ~3 MB attachment as the scheduler stages it, and its
// sha256.
func stagedFile(t *testing.T) (isolation.InFile, string) {
	t.Helper()
	data := bytes.Repeat([]byte("berth-attachment-"), 3<<20/17)
	p := filepath.Join(t.TempDir(), "x")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return isolation.InFile{Name: "x", Size: int64(len(data)), Path: p}, hex.EncodeToString(sum[:])
}

// A message's 3 MB file reaches a one-shot pod's workspace read-only
// before the agent has its request; a file the agent leaves in outbox/
// comes back with the response, and a 2 GiB sparse file there is refused
// by its size, not read.
func TestKubernetesFilesReachThePodReadOnlyAndTheReplysFilesComeBack(t *testing.T) {
	img := image(t)
	c := newCluster(t)
	in, sum := stagedFile(t)
	s := c.spec(t, img, "/sh sha256sum inbox/*/x; (echo y >> inbox/m1/x) 2>/dev/null; echo append=$?; "+
		"touch inbox/m1/new 2>/dev/null; echo create=$?; "+
		"mkdir -p outbox && printf hello > outbox/hello.txt && truncate -s 2G outbox/sparse && echo wrote")
	s.Files = &isolation.RunFiles{InDir: "inbox/m1", In: []isolation.InFile{in}, Out: isolation.FileCaps{File: 1 << 20, Total: 4 << 20}}
	began := time.Now()
	res, err := run(t, c.b, s)
	if err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, res.Stderr)
	}
	reply := res.Response.Reply
	for _, want := range []string{sum + "  inbox/m1/x", "wrote"} {
		if !strings.Contains(reply, want) {
			t.Errorf("reply lacks %q:\n%s", want, reply)
		}
	}
	if strings.Contains(reply, "append=0") || strings.Contains(reply, "create=0") {
		t.Errorf("the agent could change its attachment or its inbox directory:\n%s", reply)
	}
	got := map[string]isolation.SandboxFile{}
	for _, f := range res.ReplyFiles {
		got[f.Path] = f
	}
	if f := got["outbox/hello.txt"]; string(f.Data) != "hello" || f.Refusal != "" || f.Failed != "" {
		t.Errorf("outbox/hello.txt came back as %+v, want its bytes", f)
	}
	if f := got["outbox/sparse"]; workspacefile.Decode(f.Refusal).Why != workspacefile.TooLarge || len(f.Data) != 0 {
		t.Errorf("outbox/sparse came back as %+v, want it refused for its size", f)
	}
	if d := time.Since(began); d > 90*time.Second {
		t.Errorf("the run took %s", d)
	}
	waitGone(t, c.cs, c.ns, kube.LabelRun+"="+s.RunID)
}

// A conversation's pod takes a message's files with the request, and what
// a subverted agent names for its reply is read by the host's rules: a
// symlink to /etc/passwd, a FIFO, a 2 GiB sparse file and a path out of
// the workspace are each refused with their reason, and nothing hangs.
func TestKubernetesConversationPodTakesFilesAndRefusesHostileOutboxEntries(t *testing.T) {
	img := image(t)
	c := newCluster(t)
	k := startKept(t, c.b, c.keptSpec(t, img))
	fk, ok := k.(isolation.FilesKeeper)
	if !ok {
		t.Fatalf("a kept pod is %T, not an isolation.FilesKeeper", k)
	}
	in, sum := stagedFile(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	files := &isolation.RunFiles{InDir: "inbox/m2", In: []isolation.InFile{in}, Out: isolation.FileCaps{File: 4 << 20, Total: 8 << 20}}
	res, err := fk.RunWithFiles(ctx, keptRequest("/sh sha256sum inbox/m2/x && mkdir -p outbox && printf ok > outbox/ok.txt"), files)
	if err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, res.Stderr)
	}
	if !strings.Contains(res.Response.Reply, sum) {
		t.Fatalf("reply %q: want the attachment's sha256", res.Response.Reply)
	}
	if len(res.ReplyFiles) != 1 || string(res.ReplyFiles[0].Data) != "ok" {
		t.Fatalf("the reply's files are %+v, want outbox/ok.txt", res.ReplyFiles)
	}
	// A run without files plants what a subverted agent would name.
	if lines := keptShell(t, k, "ln -s /etc/passwd outbox/passwd && mkfifo outbox/fifo && truncate -s 2G outbox/sparse && echo planted"); !strings.Contains(strings.Join(lines, " "), "planted") {
		t.Fatalf("planting failed: %q", lines)
	}
	began := time.Now()
	got := kube.TakeFiles(ctx, k, []agentproto.OutFile{{Path: "outbox/passwd"}, {Path: "outbox/fifo"}, {Path: "outbox/sparse"},
		{Path: "../../etc/passwd"}, {Path: "/etc/passwd"}, {Path: "inbox/m2/x"}}, files.Out)
	if d := time.Since(began); d > 30*time.Second {
		t.Errorf("reading the hostile outbox took %s", d)
	}
	want := []workspacefile.Reason{workspacefile.Symlink, workspacefile.NotRegular, workspacefile.TooLarge, workspacefile.NotInside, workspacefile.NotInside, ""}
	if len(got) != len(want) {
		t.Fatalf("got %d answers, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		f := got[i]
		if f.Failed != "" {
			t.Errorf("%s: failed (%s), want an answer", f.Path, f.Failed)
			continue
		}
		if w == "" {
			if int64(len(f.Data)) != in.Size {
				t.Errorf("%s came back with %d bytes, want %d", f.Path, len(f.Data), in.Size)
			}
			continue
		}
		if r := workspacefile.Decode(f.Refusal); r.Why != w || len(f.Data) != 0 {
			t.Errorf("%s came back as %+v (%s), want refused: %s", f.Path, f, r.Note(), w)
		}
	}
	// What a reply read from outbox/ goes with it (ok.txt with the first).
	lines := strings.Join(keptShell(t, k, "ls outbox; echo end"), " ")
	if strings.Contains(lines, "ok.txt") || strings.Contains(lines, "sparse") || !strings.Contains(lines, "end") {
		t.Errorf("outbox/ holds %q after the replies, want what they read gone", lines)
	}
}
