package metrics

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestALabelCapKeepsTheFirstValuesAndFoldsTheRestIntoOther(t *testing.T) {
	t.Parallel()
	c := NewLabelCap(3)
	for _, v := range []string{"a.example", "b.example", "a.example", "c.example"} {
		if got := c.Value(v); got != v {
			t.Errorf("Value(%q) = %q while there is room", v, got)
		}
	}
	for _, v := range []string{"d.example", "e.example", strings.Repeat("x", MaxLabelLen+1)} {
		if got := c.Value(v); got != Other {
			t.Errorf("Value(%q) = %q past the cap, want %q", v, got, Other)
		}
	}
	if got := c.Value("b.example"); got != "b.example" {
		t.Errorf("a kept value became %q once the cap was full", got)
	}
	if c.Len() != 3 {
		t.Errorf("Len = %d, want 3", c.Len())
	}
}

// A flood of distinct values (a sandbox asking for random hosts) makes no
// more series than the cap and Other.
func TestACappedLabelBoundsTheSeriesOfAFlood(t *testing.T) {
	t.Parallel()
	const limit = 20
	c := NewLabelCap(limit)
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_requests_total", Help: "t"}, []string{"host"})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(counter)
	for i := range 10_000 {
		counter.WithLabelValues(c.Value(fmt.Sprintf("h%d.attacker.example", i))).Inc()
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	hosts := LabelValues(fams, "test_requests_total", "host")
	if len(hosts) != limit+1 {
		t.Errorf("%d series, want %d and %q", len(hosts), limit, Other)
	}
	if v, _ := Sample(fams, "test_requests_total", "host", Other); v != 10_000-limit {
		t.Errorf("%s counted %v, want %d", Other, v, 10_000-limit)
	}
}
