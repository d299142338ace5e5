package mountinfo_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/mountinfo"
)

func TestParseReadsEveryFieldWithOptionalFieldsAndEscapes(t *testing.T) {
	t.Parallel()
	in := `22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
35 24 0:30 / /sys/fs/cgroup/memory rw,relatime shared:9 master:3 - cgroup cgroup rw,memory
40 22 7:0 / /var/lib/berth/agents/ops\040x rw,nosuid - ext4 /dev/loop0 rw
garbage line
`
	got, err := mountinfo.Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("got %d mounts, want 3 (the garbage line skipped): %+v", len(got), got)
	}
	if m := got[1]; m.Point != "/sys/fs/cgroup/memory" || m.FSType != "cgroup" || !slices.Contains(m.Super, "memory") {
		t.Errorf("cgroup mount = %+v", m)
	}
	if m := got[2]; m.Point != "/var/lib/berth/agents/ops x" || m.Source != "/dev/loop0" || m.Root != "/" {
		t.Errorf("loop mount = %+v (the \\040 must become a space)", m)
	}
}

func TestReadListsThisThreadsMounts(t *testing.T) {
	t.Parallel()
	got, err := mountinfo.Read(mountinfo.Self)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(got, func(m mountinfo.Mount) bool { return m.Point == "/" }) {
		t.Errorf("no root mount among %d", len(got))
	}
}
