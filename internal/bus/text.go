package bus

import "strings"

// Text makes s fit a D-Bus string, which must be valid UTF-8 without NUL:
// both become U+FFFD, so a caller sees where something was dropped.
func Text(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
