package tools

import "testing"

func TestCleanTextMakesTextDeliverable(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, in, want string }{
		{"Clean_text_is_kept", "héllo\nworld", "héllo\nworld"},
		{"NUL_becomes_a_replacement_character", "a\x00b", "a\uFFFDb"},
		{"Invalid_UTF8_becomes_a_replacement_character", "a\xff\xfeb", "a\uFFFDb"},
		{"A_cut_multibyte_rune_at_the_end_is_replaced", "é"[:1], "\uFFFD"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := CleanText(tc.in); got != tc.want {
				t.Errorf("CleanText(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
