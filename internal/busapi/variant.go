package busapi

import (
	"fmt"
	"time"

	"github.com/godbus/dbus/v5"
)

// fields reads an a{sv} dictionary into typed fields. A missing key leaves
// its field zero (an older service may not send it); a key of the wrong
// type is an error, remembered for err.
type fields struct {
	m   map[string]dbus.Variant
	err error
}

func (f *fields) get(key string, dst any) {
	v, ok := f.m[key]
	if !ok || f.err != nil {
		return
	}
	if err := dbus.Store([]any{v.Value()}, dst); err != nil {
		f.err = fmt.Errorf("%w: %s has type %s: %v", ErrInvalid, key, v.Signature(), err)
	}
}

func (f *fields) str(key string, dst *string)   { f.get(key, dst) }
func (f *fields) u32(key string, dst *uint32)   { f.get(key, dst) }
func (f *fields) boolean(key string, dst *bool) { f.get(key, dst) }

// usec reads a t of microseconds since the epoch; 0 is the zero time.
func (f *fields) usec(key string, dst *time.Time) {
	var u uint64
	f.get(key, &u)
	if u != 0 {
		*dst = time.UnixMicro(int64(u)).UTC()
	}
}

func usecVariant(t time.Time) dbus.Variant {
	if t.IsZero() {
		return dbus.MakeVariant(uint64(0))
	}
	return dbus.MakeVariant(uint64(t.UnixMicro()))
}

// plain is a dictionary's values without their variants, for printing as
// JSON.
func plain(m map[string]dbus.Variant) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v.Value()
	}
	return out
}

// invalidError is a refusal whose text is the reason alone; it is ErrInvalid.
type invalidError struct{ msg string }

func (e invalidError) Error() string        { return e.msg }
func (e invalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(format string, args ...any) error {
	return invalidError{fmt.Sprintf(format, args...)}
}

// listFromWire decodes each dictionary of a list answer with from.
func listFromWire[T any](raw []map[string]dbus.Variant, from func(map[string]dbus.Variant) (T, error)) ([]T, error) {
	out := make([]T, 0, len(raw))
	for _, m := range raw {
		v, err := from(m)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}
