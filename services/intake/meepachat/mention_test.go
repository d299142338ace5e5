package meepachat

import "testing"

func TestTheLeadingMentionIsStrippedInEitherFormItIsKnownBy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		bot  botUser
		in   string
		want string
	}{
		{"Its_id_form", botUser{ID: "u1", Username: "berth"}, "<@u1> /sh ls", "/sh ls"},
		{"Its_name_form", botUser{ID: "u1", Username: "berth"}, "@Berth  /sh ls", "/sh ls"},
		{"Its_name_form_while_its_id_is_unknown", botUser{Username: "berth"}, "@berth /sh ls", "/sh ls"},
		{"No_empty_id_form_while_its_id_is_unknown", botUser{Username: "berth"}, "<@> /sh ls", "<@> /sh ls"},
		{"Not_a_longer_name", botUser{ID: "u1", Username: "berth"}, "@berthold hi", "@berthold hi"},
		{"Not_a_mention_later_in_the_text", botUser{ID: "u1", Username: "berth"}, "hi @berth", "hi @berth"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := stripLeadingMention(tc.in, tc.bot); got != tc.want {
				t.Errorf("stripLeadingMention(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
