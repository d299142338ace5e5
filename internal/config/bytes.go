package config

import (
	"fmt"
	"strconv"
	"strings"
)

// Bytes is a size as berth.toml writes it, like Docker's --memory: a whole
// number with an optional unit b, k, m or g ("512m", "1g", "0"). It is read
// once, when the file is decoded; everything after holds the number.
type Bytes int64

// sizeSyntax is what an unreadable size is told it should look like.
const sizeSyntax = "want a number with an optional unit b, k, m or g, like 512m"

// UnmarshalText reads a size written like Docker's --memory.
func (b *Bytes) UnmarshalText(text []byte) error {
	n, ok := parseBytes(string(text))
	if !ok {
		return fmt.Errorf("invalid size %q: %s", text, sizeSyntax)
	}
	*b = n
	return nil
}

// MarshalText writes the size the way UnmarshalText reads it.
func (b Bytes) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// String writes the size in its largest exact unit ("512m", "1g"), so it
// reads back to the same number.
func (b Bytes) String() string {
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"g", 30}, {"m", 20}, {"k", 10}} {
		if b != 0 && b%(1<<u.shift) == 0 {
			return strconv.FormatInt(int64(b>>u.shift), 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10)
}

func parseBytes(s string) (Bytes, bool) {
	num := strings.TrimRight(s, "bBkKmMgG")
	unit := strings.ToLower(s[len(num):])
	shift := map[string]uint{"": 0, "b": 0, "k": 10, "kb": 10, "m": 20, "mb": 20, "g": 30, "gb": 30}
	sh, ok := shift[unit]
	n, err := strconv.ParseInt(num, 10, 64)
	if !ok || err != nil || n < 0 || n > 1<<(62-sh) {
		return 0, false
	}
	return Bytes(n << sh), true
}

// sizeRule is how one size key is read: what its errors call it, its
// smallest value and whether 0 is allowed below it.
type sizeRule struct {
	what   string // "memory limit"
	min    Bytes
	minMsg string // "6m", "16m (or 0 for no quota)"
	zeroOK bool
}

// The size keys of an agent.
var (
	memoryLimitRule = sizeRule{what: "memory limit", min: minMemoryLimit, minMsg: "6m"}
	// An ext4 filesystem smaller than 16m holds little but its own metadata.
	workspaceQuotaRule = sizeRule{what: "workspace quota", min: minWorkspaceQuota, minMsg: "16m (or 0 for no quota)", zeroOK: true}
	// An inbound attachment cap of 0 takes no files at all.
	attachmentSizeRule = sizeRule{what: "attachment size", zeroOK: true}
	// [scheduler] max_reply_file_bytes and max_reply_files_bytes.
	replyFileSizeRule = sizeRule{what: "reply file size", min: 1 << 10, minMsg: "1k"}
)

// check reads s under rule; the message is "" when s is a size the key takes.
func (r sizeRule) check(s string) (Bytes, string) {
	n, ok := parseBytes(s)
	switch {
	case !ok:
		return 0, fmt.Sprintf("invalid %s %q: %s", r.what, s, sizeSyntax)
	case n < r.min && (n != 0 || !r.zeroOK):
		return 0, fmt.Sprintf("%q is below the minimum of %s", s, r.minMsg)
	}
	return n, ""
}
