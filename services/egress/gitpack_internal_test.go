package egress

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
)

// packObject writes one pack entry: the type and size header, any delta
// base reference, and the zlib stream of data.
func packObject(pack *bytes.Buffer, typ int, size int, base []byte, data []byte) {
	b := byte(typ<<4) | byte(size&15)
	size >>= 4
	for size > 0 {
		pack.WriteByte(b | 0x80)
		b, size = byte(size&0x7f), size>>7
	}
	pack.WriteByte(b)
	pack.Write(base)
	z := zlib.NewWriter(pack)
	z.Write(data)
	z.Close()
}

// ofsDeltaOffset encodes a relative offset as git's OFS_DELTA does.
func ofsDeltaOffset(off int64) []byte {
	out := []byte{byte(off & 0x7f)}
	for off >>= 7; off > 0; off >>= 7 {
		off--
		out = append([]byte{byte(0x80 | off&0x7f)}, out...)
	}
	return out
}

func deltaVarint(n int) []byte {
	var out []byte
	for {
		b := byte(n & 0x7f)
		n >>= 7
		if n == 0 {
			return append(out, b)
		}
		out = append(out, b|0x80)
	}
}

func TestGitPackCommitsAreReadByTheirContentDeltasIncluded(t *testing.T) {
	t.Parallel()
	const tree, old = "4b825dc642cb6eb9a060e54bf8d69288fbee4904", "1111111111111111111111111111111111111111"
	a := []byte("tree " + tree + "\nparent " + old + "\nauthor a <a@b> 1 +0000\ncommitter a <a@b> 1 +0000\n\none\n")
	// b is a delta of a: a's bytes up to its parent line's id, then
	// another parent, then a's rest.
	cut := bytes.Index(a, []byte(old))
	other := strings.Repeat("2", 40)
	b := append(append(append([]byte(nil), a[:cut]...), other...), a[cut+40:]...)
	var delta bytes.Buffer
	delta.Write(deltaVarint(len(a)))
	delta.Write(deltaVarint(len(b)))
	delta.Write([]byte{0x80 | 0x10, byte(cut)})                                      // copy a[0:cut]
	delta.WriteByte(40)                                                              // insert 40 bytes
	delta.WriteString(other)                                                         //
	delta.Write([]byte{0x80 | 0x01 | 0x10, byte(cut + 40), byte(len(a) - cut - 40)}) // copy the rest

	var pack bytes.Buffer
	pack.WriteString("PACK")
	binary.Write(&pack, binary.BigEndian, uint32(2))
	binary.Write(&pack, binary.BigEndian, uint32(3))
	offA := int64(pack.Len())
	packObject(&pack, packCommit, len(a), nil, a)
	packObject(&pack, 3, 5, nil, []byte("blob\n")) // a blob, read past
	offB := int64(pack.Len())
	packObject(&pack, packOfsDelta, delta.Len(), ofsDeltaOffset(offB-offA), delta.Bytes())

	commits, err := readPackCommits(&pack, "sha1")
	if err != nil {
		t.Fatal(err)
	}
	id := func(content []byte) string {
		return fmt.Sprintf("%x", sha1.Sum(append([]byte(fmt.Sprintf("commit %d\x00", len(content))), content...)))
	}
	if got := commits[id(a)]; len(got) != 1 || got[0] != old {
		t.Errorf("commit a's parents = %v, want %s (commits %v)", got, old, commits)
	}
	if got := commits[id(b)]; len(got) != 1 || got[0] != other {
		t.Errorf("the deltified commit's parents = %v, want %s (commits %v)", got, other, commits)
	}
	if found, _ := commits.ancestry(old, id(a)); !found {
		t.Error("old is not found as a's parent")
	}
	if found, boundary := commits.ancestry(old, id(b)); found || len(boundary) != 1 || boundary[0] != other {
		t.Errorf("b's ancestry = %v, %v; want the walk to leave the pack at %s", found, boundary, other)
	}
}

func TestGitPushCommandsAreReadBeforeThePack(t *testing.T) {
	t.Parallel()
	old, new := strings.Repeat("a", 40), strings.Repeat("b", 40)
	pkt := func(s string) string { return fmt.Sprintf("%04x%s", len(s)+4, s) }
	body := pkt("shallow "+old+"\n") + pkt(old+" "+new+" refs/heads/berth/x\x00report-status side-band-64k push-options\n") +
		pkt(strings.Repeat("0", 40)+" "+new+" refs/heads/berth/y\n") + "0000" + pkt("ci.skip\n") + "0000" + "PACK"
	r := strings.NewReader(body)
	cmds, err := readPushCommands(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds.updates) != 2 || cmds.updates[0].Ref != "refs/heads/berth/x" || cmds.updates[1].Old != strings.Repeat("0", 40) || !cmds.has("side-band-64k") {
		t.Fatalf("commands = %+v", cmds)
	}
	if rest := body[len(body)-r.Len():]; rest != "PACK" {
		t.Errorf("left at %q, want the pack", rest)
	}
	for _, bad := range []string{
		pkt("push-cert\x00report-status\n") + "0000",
		pkt(old+" "+new+"\x00report-status\n") + "0000",
		pkt(old+" "+new[:39]+" refs/heads/x\n") + "0000",
		pkt(old)[:3],
	} {
		if _, err := readPushCommands(strings.NewReader(bad)); err == nil {
			t.Errorf("%q was read as a command list", bad)
		}
	}
	report := string(reportStatus(cmds, []string{"berth: no", "berth: not pushed"}))
	want := pkt("\x01"+pkt("unpack ok\n")+pkt("ng refs/heads/berth/x berth: no\n")+pkt("ng refs/heads/berth/y berth: not pushed\n")+"0000") + "0000"
	if report != want {
		t.Errorf("report-status = %q, want %q", report, want)
	}
}
