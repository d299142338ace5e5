package config

import (
	"fmt"
	"strings"
)

// Error is one problem in a configuration file.
type Error struct {
	File string
	Line int    // 0 when unknown
	Key  string // full key, e.g. agents[1].container_mode.network; empty when none applies
	Msg  string

	err error // underlying cause (I/O errors), for errors.Is
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

func (e *Error) Unwrap() error { return e.err }

// Errors is every problem found while loading a configuration, one per line.
type Errors []*Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

func (es Errors) Unwrap() []error {
	errs := make([]error, len(es))
	for i, e := range es {
		errs[i] = e
	}
	return errs
}
