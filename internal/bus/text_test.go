package bus_test

import (
	"testing"

	"github.com/berth-dev/berth/internal/bus"
)

func TestTextReplacesWhatADBusStringCannotHold(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, in, want string }{
		{"Plain_text_is_kept", "héllo\nthere", "héllo\nthere"},
		{"NUL_becomes_a_replacement_character", "hi\x00there", "hi\uFFFDthere"},
		{"Invalid_UTF8_becomes_a_replacement_character", "a\xffda", "a\uFFFDda"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := bus.Text(tt.in); got != tt.want {
				t.Errorf("Text(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}
