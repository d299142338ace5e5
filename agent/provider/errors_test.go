package provider

import "testing"

func TestErrorNamesTheStatusWithoutAGapForCodesHTTPDoesNotName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  Error
		want string
	}{
		{Error{Status: 503, Msg: "down"}, "HTTP 503 Service Unavailable: down"},
		{Error{Status: 529, Msg: "Overloaded"}, "HTTP 529: Overloaded"},
		{Error{Msg: "cannot reach the API: refused"}, "cannot reach the API: refused"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
}
