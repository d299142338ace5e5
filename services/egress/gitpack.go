package egress

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/egresspolicy"
)

// maxPktLine is git's largest pkt-line, length prefix included.
const maxPktLine = 65520

// readPktLine reads one pkt-line: its payload, or flush for "0000" (and
// the delimiter and end packets of protocol v2, which a push never sends).
func readPktLine(r io.Reader) (payload []byte, flush bool, err error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, false, fmt.Errorf("cannot read a pkt-line: %w", err)
	}
	n, err := strconv.ParseUint(string(head[:]), 16, 16)
	if err != nil {
		return nil, false, fmt.Errorf("cannot read a pkt-line: %q is not a length", head[:])
	}
	switch {
	case n == 0:
		return nil, true, nil
	case n < 4 || n > maxPktLine:
		return nil, false, fmt.Errorf("cannot read a pkt-line: length %d", n)
	}
	payload = make([]byte, n-4)
	if _, err := io.ReadFull(r, payload); err != nil {
		return nil, false, fmt.Errorf("cannot read a pkt-line: %w", err)
	}
	return payload, false, nil
}

func writePktLine(w *bytes.Buffer, payload []byte) {
	fmt.Fprintf(w, "%04x", len(payload)+4)
	w.Write(payload)
}

// pushCommands is the head of a receive-pack request: the ref updates and
// the client's capabilities, read before anything is forwarded.
type pushCommands struct {
	updates []egresspolicy.RefUpdate
	caps    []string
}

func (c pushCommands) has(capability string) bool {
	for _, cp := range c.caps {
		if cp == capability {
			return true
		}
	}
	return false
}

// objectFormat is the hash the repository names objects with.
func (c pushCommands) objectFormat() string {
	for _, cp := range c.caps {
		if f, ok := strings.CutPrefix(cp, "object-format="); ok {
			return f
		}
	}
	return "sha1"
}

// maxPushCommands bounds the ref updates of one push the proxy judges.
const maxPushCommands = 1000

// readPushCommands reads the command list up to its flush, and the push
// options after it when the client announced them; r is left at the pack.
func readPushCommands(r io.Reader) (pushCommands, error) {
	var cmds pushCommands
	// Shallow lines come first; the first command (or push-cert) after
	// them carries the capabilities.
	first := true
	for {
		line, flush, err := readPktLine(r)
		if err != nil {
			return cmds, err
		}
		if flush {
			break
		}
		if bytes.HasPrefix(line, []byte("shallow ")) && first {
			continue
		}
		if first {
			var caps []byte
			line, caps, _ = bytes.Cut(line, []byte{0})
			cmds.caps = strings.Fields(string(caps))
			first = false
		} else if bytes.IndexByte(line, 0) >= 0 {
			// receive-pack reads a ref up to a NUL on any line: what follows
			// must not reach the judge as part of the ref (git sends none).
			return cmds, errors.New("a push command after the first carries capabilities (a NUL)")
		}
		text := strings.TrimSuffix(string(line), "\n")
		if strings.HasPrefix(text, "push-cert") {
			return cmds, errors.New("a signed push (push-cert) is not judged by berth: push without --signed")
		}
		// Split as receive-pack does: one space each, the ref the rest of
		// the line (strings.Fields would drop what git keeps in the ref).
		f := strings.SplitN(text, " ", 3)
		if len(f) != 3 || !objectID(f[0]) || !objectID(f[1]) || len(f[0]) != len(f[1]) || f[2] == "" {
			return cmds, fmt.Errorf("%q is not a push command (old new ref)", text)
		}
		if len(cmds.updates) == maxPushCommands {
			return cmds, fmt.Errorf("a push of more than %d refs", maxPushCommands)
		}
		cmds.updates = append(cmds.updates, egresspolicy.RefUpdate{Old: f[0], New: f[1], Ref: f[2]})
	}
	if cmds.has("push-options") && len(cmds.updates) > 0 {
		for {
			_, flush, err := readPktLine(r)
			if err != nil {
				return cmds, err
			}
			if flush {
				break
			}
		}
	}
	return cmds, nil
}

func objectID(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

// reportStatus is receive-pack's answer refusing every update of cmds, in
// the form the client asked for (inside side band 1 when it did), so git
// prints "! [remote rejected] <ref> (<reason>)".
func reportStatus(cmds pushCommands, reasons []string) []byte {
	var rep bytes.Buffer
	writePktLine(&rep, []byte("unpack ok\n"))
	for i, u := range cmds.updates {
		writePktLine(&rep, []byte("ng "+u.Ref+" "+strings.ReplaceAll(reasons[i], "\n", " ")+"\n"))
	}
	rep.WriteString("0000")
	if !cmds.has("side-band-64k") && !cmds.has("side-band") {
		return rep.Bytes()
	}
	limit := maxPktLine - 5
	if !cmds.has("side-band-64k") {
		limit = 1000 - 5
	}
	var out bytes.Buffer
	for b := rep.Bytes(); len(b) > 0; {
		n := min(limit, len(b))
		writePktLine(&out, append([]byte{1}, b[:n]...))
		b = b[n:]
	}
	out.WriteString("0000")
	return out.Bytes()
}

// Pack object types (git's pack format).
const (
	packCommit   = 1
	packOfsDelta = 6
	packRefDelta = 7
)

// packCommits are the commits a pushed pack holds: each one's parents, by
// the id its content hashes to (never an id the client names).
type packCommits map[string][]string

// maxPackCommitBytes bounds the commit contents held while a pack is read.
const maxPackCommitBytes = 64 << 20

// readPackCommits reads a pack (git's version 2 or 3) and returns its
// commits, deltified ones resolved when their base is in the pack. Other
// objects are inflated and dropped.
func readPackCommits(r io.Reader, objectFormat string) (packCommits, error) {
	newHash, idLen := sha1.New, 20
	if objectFormat == "sha256" {
		newHash, idLen = sha256.New, 32
	}
	cr := &countingByteReader{r: bufio.NewReaderSize(r, 64<<10)}
	var head [12]byte
	if _, err := io.ReadFull(cr, head[:]); err != nil {
		return nil, fmt.Errorf("cannot read the pack: %w", err)
	}
	if string(head[:4]) != "PACK" || (head[7] != 2 && head[7] != 3) {
		return nil, errors.New("cannot read the pack: not a version 2 or 3 pack")
	}
	count := int(head[8])<<24 | int(head[9])<<16 | int(head[10])<<8 | int(head[11])
	commits := packCommits{}
	byOffset := map[int64][]byte{} // commit contents, for deltas against them
	byID := map[string][]byte{}
	held := 0
	keep := func(offset int64, content []byte, h func() hash.Hash) error {
		if held += len(content); held > maxPackCommitBytes {
			return fmt.Errorf("cannot read the pack: its commits are over %d bytes", maxPackCommitBytes)
		}
		id := commitID(h(), content)
		byOffset[offset] = content
		byID[id] = content
		commits[id] = commitParents(content)
		return nil
	}
	for range count {
		offset := cr.n
		typ, _, err := readObjectHeader(cr)
		if err != nil {
			return nil, err
		}
		var base []byte
		var baseKnown bool
		switch typ {
		case packOfsDelta:
			rel, err := readOffset(cr)
			if err != nil {
				return nil, err
			}
			base, baseKnown = byOffset[offset-rel]
		case packRefDelta:
			id := make([]byte, idLen)
			if _, err := io.ReadFull(cr, id); err != nil {
				return nil, fmt.Errorf("cannot read the pack: %w", err)
			}
			base, baseKnown = byID[hex.EncodeToString(id)]
		}
		wanted := typ == packCommit || baseKnown
		data, err := inflate(cr, wanted)
		if err != nil {
			return nil, err
		}
		if !wanted {
			continue
		}
		if baseKnown {
			if data, err = applyDelta(base, data); err != nil {
				return nil, err
			}
		}
		if err := keep(offset, data, newHash); err != nil {
			return nil, err
		}
	}
	return commits, nil
}

func commitID(h hash.Hash, content []byte) string {
	fmt.Fprintf(h, "commit %d\x00", len(content))
	h.Write(content)
	return hex.EncodeToString(h.Sum(nil))
}

// commitParents are the parent ids of a commit's content, read as git
// reads them: the "parent" lines right after the first, "tree", line; one
// elsewhere is no parent to git, so none to the judge either. A commit
// git cannot read has none: its update is no fast-forward.
func commitParents(content []byte) []string {
	lines := bytes.Split(content, []byte("\n"))
	if len(lines) == 0 || !bytes.HasPrefix(lines[0], []byte("tree ")) {
		return nil
	}
	var parents []string
	for _, line := range lines[1:] {
		p, ok := bytes.CutPrefix(line, []byte("parent "))
		if !ok {
			break
		}
		// Git reads an id in either case; the pack's ids are lower case.
		id := strings.ToLower(string(p))
		if !objectID(id) {
			// Git refuses the commit; the forge must not be asked about it
			// (the id goes into the compare URL, with the run's token).
			return nil
		}
		parents = append(parents, id)
	}
	return parents
}

type countingByteReader struct {
	r *bufio.Reader
	n int64
}

func (c *countingByteReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countingByteReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil {
		c.n++
	}
	return b, err
}

func readObjectHeader(r io.ByteReader) (typ int, size int64, err error) {
	b, err := r.ReadByte()
	if err != nil {
		return 0, 0, fmt.Errorf("cannot read the pack: %w", err)
	}
	typ, size = int(b>>4&7), int64(b&15)
	for shift := 4; b&0x80 != 0; shift += 7 {
		if b, err = r.ReadByte(); err != nil || shift > 56 {
			return 0, 0, errors.New("cannot read the pack: a bad object header")
		}
		size |= int64(b&0x7f) << shift
	}
	return typ, size, nil
}

func readOffset(r io.ByteReader) (int64, error) {
	b, err := r.ReadByte()
	if err != nil {
		return 0, fmt.Errorf("cannot read the pack: %w", err)
	}
	off := int64(b & 0x7f)
	for i := 0; b&0x80 != 0; i++ {
		if b, err = r.ReadByte(); err != nil || i > 8 {
			return 0, errors.New("cannot read the pack: a bad delta offset")
		}
		off = (off+1)<<7 | int64(b&0x7f)
	}
	return off, nil
}

// inflate reads one zlib stream; its content when keep, else discarded.
func inflate(r *countingByteReader, keep bool) ([]byte, error) {
	zr, err := zlib.NewReader(r)
	if err != nil {
		return nil, fmt.Errorf("cannot read the pack: %w", err)
	}
	defer zr.Close()
	if !keep {
		_, err = io.Copy(io.Discard, zr)
		if err != nil {
			return nil, fmt.Errorf("cannot read the pack: %w", err)
		}
		return nil, nil
	}
	data, err := io.ReadAll(io.LimitReader(zr, maxPackCommitBytes+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read the pack: %w", err)
	}
	if len(data) > maxPackCommitBytes {
		return nil, errors.New("cannot read the pack: a commit is too large")
	}
	return data, nil
}

// applyDelta applies a git delta to base.
func applyDelta(base, delta []byte) ([]byte, error) {
	bad := errors.New("cannot read the pack: a bad delta")
	d := bytes.NewReader(delta)
	varint := func() (int, error) {
		v, shift := 0, 0
		for {
			b, err := d.ReadByte()
			if err != nil || shift > 56 {
				return 0, bad
			}
			v |= int(b&0x7f) << shift
			if b&0x80 == 0 {
				return v, nil
			}
			shift += 7
		}
	}
	srcSize, err := varint()
	if err != nil || srcSize != len(base) {
		return nil, bad
	}
	dstSize, err := varint()
	if err != nil || dstSize > maxPackCommitBytes {
		return nil, bad
	}
	out := make([]byte, 0, dstSize)
	for d.Len() > 0 {
		op, _ := d.ReadByte()
		switch {
		case op&0x80 != 0:
			var off, n int
			for i := range 4 {
				if op&(1<<i) != 0 {
					b, err := d.ReadByte()
					if err != nil {
						return nil, bad
					}
					off |= int(b) << (8 * i)
				}
			}
			for i := range 3 {
				if op&(0x10<<i) != 0 {
					b, err := d.ReadByte()
					if err != nil {
						return nil, bad
					}
					n |= int(b) << (8 * i)
				}
			}
			if n == 0 {
				n = 0x10000
			}
			if off+n > len(base) || len(out)+n > dstSize {
				return nil, bad
			}
			out = append(out, base[off:off+n]...)
		case op != 0:
			chunk := make([]byte, op)
			if _, err := io.ReadFull(d, chunk); err != nil || len(out)+int(op) > dstSize {
				return nil, bad
			}
			out = append(out, chunk...)
		default:
			return nil, bad
		}
	}
	if len(out) != dstSize {
		return nil, bad
	}
	return out, nil
}

// ancestry says whether old is an ancestor of new as far as the pack
// tells: found when a path from new through the pack's commits reaches
// old; else the commits outside the pack where those paths leave it (new
// itself when the pack does not hold it), which only the forge can judge.
func (pc packCommits) ancestry(old, new string) (found bool, boundary []string) {
	seen := map[string]bool{}
	queue := []string{new}
	for len(queue) > 0 {
		id := queue[0]
		queue = queue[1:]
		if seen[id] {
			continue
		}
		seen[id] = true
		if id == old {
			return true, nil
		}
		parents, inPack := pc[id]
		if !inPack {
			boundary = append(boundary, id)
			continue
		}
		queue = append(queue, parents...)
	}
	return false, boundary
}
