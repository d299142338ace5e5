package tools

import "strings"

// CleanText makes s deliverable as a D-Bus string: valid UTF-8 without NUL.
// Each run of invalid bytes and each NUL becomes U+FFFD, so a tool that
// prints binary output still yields a reply the scheduler can deliver.
func CleanText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
