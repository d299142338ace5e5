// Package workspacefile reads a file out of a workspace its sandbox
// controls, the one way the scheduler (on the host) and berth-agent's
// files-out helper (in a pod, ADR 29) both do it: every path is opened
// beneath the workspace with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|
// RESOLVE_NO_MAGICLINKS|RESOLVE_NO_XDEV) and O_PATH first, so no symlink
// on the path is followed, nothing outside the workspace is reached, and
// nothing but a regular file is ever opened for reading (a FIFO would
// block, a device could act on the open). A file with more than one hard
// link is refused: where fs.protected_hardlinks is off, the agent's uid can
// link a file it cannot read, and the link would carry the reader's rights.
//
// A refusal is a Reason code with its sizes, never free text, so what a
// hostile pod says about a file cannot put words of its own into a reply.
package workspacefile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentproto"
)

// Reason says why a file was not read.
type Reason string

// The reasons a file is refused.
const (
	NotInside  Reason = "not-inside"
	Missing    Reason = "missing"
	Symlink    Reason = "symlink"
	LeavesXDev Reason = "leaves"
	NotRegular Reason = "not-regular"
	HardLinks  Reason = "hard-links"
	TooLarge   Reason = "too-large"
	Grew       Reason = "grew"
	Unreadable Reason = "unreadable"
	// OverTotal: the reply's files together would pass their cap.
	OverTotal Reason = "over-total"
)

// Refusal is why a file was not read: a Reason and the sizes it names.
type Refusal struct {
	Why   Reason
	Size  int64  // TooLarge: the file's size
	Limit int64  // TooLarge, Grew, OverTotal: the cap
	Err   string // Unreadable: the error, on the reader's own side only
}

// Note is the refusal as a reply says it ("<name> was not sent: <note>").
func (r Refusal) Note() string {
	switch r.Why {
	case NotInside:
		return "its path is not inside the workspace"
	case Missing:
		return "it does not exist"
	case Symlink:
		return "it is a symbolic link, or its path goes through one"
	case LeavesXDev:
		return "its path leaves the workspace"
	case NotRegular:
		return "it is not a regular file"
	case HardLinks:
		return "it has more than one hard link"
	case TooLarge:
		return fmt.Sprintf("it is %s, more than the %s a file may have (max_reply_file_bytes)", humanBytes(r.Size), humanBytes(r.Limit))
	case Grew:
		return fmt.Sprintf("it grew past the %s a file may have (max_reply_file_bytes)", humanBytes(r.Limit))
	case OverTotal:
		return fmt.Sprintf("the reply's files would pass the %s all of them may have (max_reply_files_bytes)", humanBytes(r.Limit))
	case Unreadable:
		if r.Err != "" {
			return fmt.Sprintf("it cannot be read (%s)", r.Err)
		}
		return "it cannot be read"
	}
	return "its sandbox refused it"
}

// Encode is the refusal as one line a pod's helper sends: its reason and
// sizes, never the error text.
func (r Refusal) Encode() string {
	return fmt.Sprintf("%s %d %d", r.Why, r.Size, r.Limit)
}

// Decode reads what Encode wrote; anything else is a refusal of an
// unknown reason (its note says the sandbox refused the file).
func Decode(s string) Refusal {
	f := strings.Fields(s)
	if len(f) != 3 {
		return Refusal{Why: "unknown"}
	}
	size, err1 := strconv.ParseInt(f[1], 10, 64)
	limit, err2 := strconv.ParseInt(f[2], 10, 64)
	r := Refusal{Why: Reason(f[0]), Size: size, Limit: limit}
	switch r.Why {
	case NotInside, Missing, Symlink, LeavesXDev, NotRegular, HardLinks, TooLarge, Grew, Unreadable, OverTotal:
	default:
		r.Why = "unknown"
	}
	if err1 != nil || err2 != nil || size < 0 || limit < 0 {
		return Refusal{Why: "unknown"}
	}
	return r
}

// Open opens the workspace directory as the root every Read is beneath.
func Open(workspace string) (int, error) {
	ws, err := unix.Open(workspace, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("cannot open the workspace %s: %w", workspace, err)
	}
	return ws, nil
}

var beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// Read reads rel beneath the workspace ws, at most limit bytes; a non-nil
// Refusal says why it was not read.
func Read(ws int, rel string, limit int64) ([]byte, *Refusal) {
	rel = path.Clean(rel)
	if rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || path.IsAbs(rel) {
		return nil, &Refusal{Why: NotInside}
	}
	fd, err := unix.Openat2(ws, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: uint64(beneath)})
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, &Refusal{Why: Missing}
	case errors.Is(err, unix.ELOOP):
		return nil, &Refusal{Why: Symlink}
	case errors.Is(err, unix.EXDEV):
		return nil, &Refusal{Why: LeavesXDev}
	case err != nil:
		return nil, &Refusal{Why: Unreadable, Err: err.Error()}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &Refusal{Why: Unreadable, Err: err.Error()}
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return nil, &Refusal{Why: Symlink}
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, &Refusal{Why: NotRegular}
	case st.Nlink > 1:
		return nil, &Refusal{Why: HardLinks}
	case st.Size > limit:
		return nil, &Refusal{Why: TooLarge, Size: st.Size, Limit: limit}
	}
	// Reopening the O_PATH descriptor reads the very inode just checked.
	f, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fd), os.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, &Refusal{Why: Unreadable, Err: err.Error()}
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, &Refusal{Why: Unreadable, Err: err.Error()}
	}
	if int64(len(data)) > limit {
		return nil, &Refusal{Why: Grew, Limit: limit}
	}
	return data, nil
}

// OutboxName is the name of rel's file when rel is directly in the
// workspace's outbox/ (such a file goes out with one reply only).
func OutboxName(rel string) (string, bool) {
	rest, ok := strings.CutPrefix(path.Clean(rel), agentproto.OutboxDir+"/")
	if !ok || rest == "" || strings.Contains(rest, "/") {
		return "", false
	}
	return rest, true
}

// RemoveFromOutbox unlinks name in the workspace's outbox/, never
// following a symlink.
func RemoveFromOutbox(ws int, name string) {
	dir, err := unix.Openat2(ws, agentproto.OutboxDir, &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: uint64(beneath),
	})
	if err != nil {
		return
	}
	defer unix.Close(dir)
	_ = unix.Unlinkat(dir, name, 0)
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
