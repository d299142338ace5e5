// Package podfiles is berth-agent's helper for a pod's files (ADR 29): it
// runs in the pod's "files" container, which shares the workspace with the
// agent's, and berth execs into it to place a message's files before the
// agent has its request (In) and to read a reply's files after it answered
// (Out). Wait keeps the container up meanwhile.
//
// The helper runs with the agent's uid in the agent's pod, so it guards no
// privilege of its own: what it refuses it refuses so that a pod's reply
// holds to the rules of a host's (package workspacefile), and berth bounds
// and checks everything it sends.
package podfiles

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/workspacefile"
)

// Wait blocks until SIGTERM or SIGINT (the pod's deletion) and returns 0.
func Wait() int {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	<-ch
	return 0
}

// In unpacks the tar on stdin beneath workspace/dir: berth made dir
// (inbox/<message id>) and every name in it. An earlier copy goes; each
// entry must be a regular file of one path element; the files end 0444
// and the directory 0555. Anything else fails the whole placement.
func In(args []string, stdin io.Reader, stderr io.Writer) int {
	if err := in(args, stdin); err != nil {
		fmt.Fprintf(stderr, "cannot place the message's files: %v\n", err)
		return 1
	}
	return 0
}

func in(args []string, stdin io.Reader) error {
	if len(args) != 2 {
		return errors.New("usage: files-in <workspace> <dir>")
	}
	dir := path.Clean(args[1])
	if !strings.HasPrefix(dir, "inbox/") || strings.Count(dir, "/") != 1 || strings.HasSuffix(dir, "/..") {
		return fmt.Errorf("%q is not inbox/<one name>", args[1])
	}
	ws, err := os.OpenRoot(args[0])
	if err != nil {
		return err
	}
	defer ws.Close()
	if err := ws.MkdirAll("inbox", 0o755); err != nil {
		return err
	}
	if fi, err := ws.Lstat(dir); err == nil && fi.IsDir() {
		_ = ws.Chmod(dir, 0o755) // the earlier copy's 0555 would keep RemoveAll out
	}
	if err := ws.RemoveAll(dir); err != nil {
		return err
	}
	if err := ws.Mkdir(dir, 0o755); err != nil {
		return err
	}
	tr := tar.NewReader(stdin)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg || h.Name == "" || h.Name != path.Base(h.Name) || h.Name == "." || h.Name == ".." || h.Size < 0 {
			return fmt.Errorf("refusing tar entry %q of type %q: only regular files of one path element", h.Name, h.Typeflag)
		}
		if err := placeOne(ws, path.Join(dir, h.Name), tr, h.Size); err != nil {
			return fmt.Errorf("file %s: %w", h.Name, err)
		}
	}
	return ws.Chmod(dir, 0o555)
}

func placeOne(ws *os.Root, name string, src io.Reader, size int64) error {
	out, err := ws.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return err
	}
	defer out.Close()
	if n, err := io.Copy(out, io.LimitReader(src, size)); err != nil {
		return err
	} else if n != size {
		return fmt.Errorf("%d bytes of %d", n, size)
	}
	if err := out.Chmod(0o444); err != nil {
		return err
	}
	return out.Close()
}

// Out answers one FilesOutRequest on stdin with a tar on stdout: entry i
// (named i) holds path i's bytes, read as workspacefile reads on a host,
// or no bytes and the refusal in its PAX record. A file sent from outbox/
// is removed from it, as the scheduler does on a host.
func Out(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if err := out(args, stdin, stdout); err != nil {
		fmt.Fprintf(stderr, "cannot send the reply's files: %v\n", err)
		return 1
	}
	return 0
}

func out(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: files-out <workspace>")
	}
	var req agentproto.FilesOutRequest
	if err := json.NewDecoder(io.LimitReader(stdin, 1<<20)).Decode(&req); err != nil {
		return fmt.Errorf("cannot read the request: %w", err)
	}
	ws, err := workspacefile.Open(args[0])
	if err != nil {
		return err
	}
	defer unix.Close(ws)
	tw := tar.NewWriter(stdout)
	var total int64
	for i, p := range req.Paths {
		if i >= agentproto.MaxOutFiles {
			break
		}
		data, refused := workspacefile.Read(ws, p, req.File)
		if name, ok := workspacefile.OutboxName(p); ok {
			workspacefile.RemoveFromOutbox(ws, name)
		}
		if refused == nil && total+int64(len(data)) > req.Total {
			refused = &workspacefile.Refusal{Why: workspacefile.OverTotal, Limit: req.Total}
		}
		h := &tar.Header{Name: strconv.Itoa(i), Typeflag: tar.TypeReg, Mode: 0o600, Format: tar.FormatPAX}
		if refused != nil {
			h.PAXRecords = map[string]string{agentproto.FilesRefusalRecord: refused.Encode()}
			data = nil
		}
		h.Size = int64(len(data))
		total += h.Size
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	return tw.Close()
}
