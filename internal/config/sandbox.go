package config

import (
	"fmt"
	"strconv"
	"strings"
)

// minWorkspaceQuota is the smallest workspace_quota other than 0: an ext4
// filesystem smaller than this holds little but its own metadata.
const minWorkspaceQuota = 16 << 20

// maxAgentUIDs bounds an agent_uids range: more agents than this on one
// host is a mistake in the range, not a plan.
const maxAgentUIDs = 1 << 24

// ParseUIDRange reads agent_uids: "FIRST-LAST" (inclusive) or "off".
// Neither end may be 0, 65534 (nobody) or above 2^31-1, and the range must
// not include uids below 1000 (the system's own accounts).
func ParseUIDRange(s string) (UIDRange, error) {
	if s == "off" {
		return UIDRange{Off: true}, nil
	}
	lo, hi, ok := strings.Cut(s, "-")
	first, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 32)
	last, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return UIDRange{}, fmt.Errorf("invalid uid range %q: want FIRST-LAST, like %d-%d, or \"off\"", s, DefaultAgentUIDs.First, DefaultAgentUIDs.Last)
	}
	switch {
	case first > last:
		return UIDRange{}, fmt.Errorf("invalid uid range %q: %d is above %d", s, first, last)
	case first < 1000:
		return UIDRange{}, fmt.Errorf("invalid uid range %q: starts below 1000, among the system's own accounts", s)
	case last > 1<<31-1:
		return UIDRange{}, fmt.Errorf("invalid uid range %q: ends above 2147483647", s)
	case first <= 65534 && 65534 <= last:
		return UIDRange{}, fmt.Errorf("invalid uid range %q: includes 65534 (nobody)", s)
	case last-first+1 > maxAgentUIDs:
		return UIDRange{}, fmt.Errorf("invalid uid range %q: more than %d ids", s, maxAgentUIDs)
	}
	return UIDRange{First: uint32(first), Last: uint32(last)}, nil
}

// String is the range as agent_uids writes it.
func (r UIDRange) String() string {
	if r.Off {
		return "off"
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// UnmarshalText reads agent_uids as ParseUIDRange does.
func (r *UIDRange) UnmarshalText(text []byte) error {
	parsed, err := ParseUIDRange(string(text))
	if err != nil {
		return err
	}
	*r = parsed
	return nil
}
