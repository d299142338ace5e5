package metrics

import (
	dto "github.com/prometheus/client_model/go"
)

// Sample finds the series of family name whose labels include the given
// name/value pairs and returns its value: a counter's or gauge's value, a
// histogram's or summary's sample count. Tests and berthctl read series
// with it.
func Sample(fams []*dto.MetricFamily, name string, labelPairs ...string) (float64, bool) {
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.Metric {
			if !hasLabels(m, labelPairs) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue(), true
			case m.Gauge != nil:
				return m.Gauge.GetValue(), true
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount()), true
			case m.Summary != nil:
				return float64(m.Summary.GetSampleCount()), true
			case m.Untyped != nil:
				return m.Untyped.GetValue(), true
			}
		}
	}
	return 0, false
}

// LabelValues are the values label takes in family name.
func LabelValues(fams []*dto.MetricFamily, name, label string) []string {
	var out []string
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == label {
					out = append(out, l.GetValue())
				}
			}
		}
	}
	return out
}

func hasLabels(m *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		found := false
		for _, l := range m.Label {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
