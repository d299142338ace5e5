package hostrun

import "testing"

// systemctl shows an attempt's unit as berth-run-<run id>-<attempt>.service:
// the separator is not escaped to \x2d, and attempt 0 is the run's name.
func TestAnAttemptsUnitIsNamedWithItsAttempt(t *testing.T) {
	t.Parallel()
	run := "20261201T113402_018006016_6bcbbdf01b"
	if got, want := attemptUnitName(run, 2), "berth-run-"+run+"-2.service"; got != want {
		t.Errorf("attemptUnitName(%q, 2) = %q, want %q", run, got, want)
	}
	if got, want := attemptUnitName(run, 0), UnitName(run); got != want {
		t.Errorf("attemptUnitName(%q, 0) = %q, want %q", run, got, want)
	}
}
