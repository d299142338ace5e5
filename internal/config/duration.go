package config

import (
	"fmt"
	"time"
)

// Duration is a length of time as berth.toml writes it: a number with a
// unit s, m or h ("90s", "30m", "1h30m"), never negative. Like Bytes, it is
// read once, when the file is decoded.
type Duration time.Duration

// UnmarshalText reads a duration written as time.ParseDuration reads it.
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := time.ParseDuration(string(text))
	if err != nil || v < 0 {
		return fmt.Errorf("invalid duration %q: want a number with a unit s, m or h, like 30m or 1h30m", text)
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes the duration the way UnmarshalText reads it.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

func (d Duration) String() string { return time.Duration(d).String() }
