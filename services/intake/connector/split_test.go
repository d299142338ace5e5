package connector

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// fencesBalanced reports whether every fence opened in chunk is closed in it.
func fencesBalanced(chunk string) bool {
	open := ""
	for _, line := range strings.Split(chunk, "\n") {
		m := fenceMarker(strings.TrimSpace(line))
		switch {
		case m == "":
		case open == "":
			open = m
		case strings.TrimSpace(line) == open:
			open = ""
		}
	}
	return open == ""
}

func TestSplit(t *testing.T) {
	t.Parallel()
	code := "```go\n" + strings.Repeat("fmt.Println(\"héllo, wörld\") // ✓\n", 200) + "```\n"
	long := strings.Repeat("prose ", 700) + "\n\n" + code + "after the block " + strings.Repeat("é", 3000)
	tests := []struct {
		name  string
		text  string
		limit int
	}{
		{"Short_text_is_one_chunk", "hello", 2000},
		{"A_9000_character_reply_with_a_code_block_within_Discord_limit", long, 2000},
		{"The_same_within_Slack_and_MeepaChat_limit", long, 4000},
		{"One_long_line_of_multibyte_runes", strings.Repeat("日本語", 3000), 2000},
		{"Tilde_fences", "~~~\n" + strings.Repeat("x\n", 3000) + "~~~", 500},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			chunks := Split(tc.text, tc.limit)
			if len(chunks) == 0 {
				t.Fatal("no chunks")
			}
			var rebuilt strings.Builder
			for i, c := range chunks {
				if n := utf8.RuneCountInString(c); n > tc.limit {
					t.Errorf("chunk %d has %d runes, limit %d", i, n, tc.limit)
				}
				if !utf8.ValidString(c) {
					t.Errorf("chunk %d is not valid UTF-8", i)
				}
				if !fencesBalanced(c) {
					t.Errorf("chunk %d leaves a fence open:\n%.200s ... %.200s", i, c, c[max(0, len(c)-200):])
				}
				rebuilt.WriteString(c)
			}
			// Nothing is lost: every non-fence, non-space character survives in order.
			strip := func(s string) string {
				var b strings.Builder
				for _, line := range strings.Split(s, "\n") {
					if fenceMarker(strings.TrimSpace(line)) != "" {
						continue
					}
					b.WriteString(strings.ReplaceAll(line, " ", ""))
				}
				return b.String()
			}
			if got, want := strip(strings.Join(chunks, "\n")), strip(tc.text); got != want {
				t.Errorf("content changed: got %d bytes, want %d", len(got), len(want))
			}
		})
	}
}

func TestSplitEmptyTextHasNoChunks(t *testing.T) {
	t.Parallel()
	if got := Split("", 100); got != nil {
		t.Fatalf("Split(\"\") = %q, want nil", got)
	}
}
