package config

import (
	"strconv"
	"strings"
)

// keyLines maps every key of a TOML document to the line it is written on.
// Keys are spelled as in error messages: dotted, with the index of each
// array element (agents[1].container_mode.network, tools.allow[2]).
// A key first seen in a header maps to the header's line.
//
// The toml package does not expose key positions, so this scans the text.
// It runs only on documents the toml package has already accepted, so it
// does not validate anything; on input it does not understand it moves on.
func keyLines(src string) map[string]int {
	s := &keyScanner{src: src, line: 1, lines: map[string]int{}, arrays: map[string]int{}}
	s.document()
	return s.lines
}

type keyScanner struct {
	src    string
	pos    int
	line   int
	lines  map[string]int
	arrays map[string]int // array-of-tables key → elements seen so far
	table  string         // key of the table the following key/values belong to
}

func (s *keyScanner) eof() bool { return s.pos >= len(s.src) }

func (s *keyScanner) peek() byte {
	if s.eof() {
		return 0
	}
	return s.src[s.pos]
}

func (s *keyScanner) has(prefix string) bool { return strings.HasPrefix(s.src[s.pos:], prefix) }

func (s *keyScanner) advance(n int) {
	for ; n > 0 && !s.eof(); n-- {
		if s.src[s.pos] == '\n' {
			s.line++
		}
		s.pos++
	}
}

func (s *keyScanner) record(key string, line int) {
	if _, ok := s.lines[key]; !ok {
		s.lines[key] = line
	}
}

func (s *keyScanner) skipSpace() {
	for c := s.peek(); c == ' ' || c == '\t'; c = s.peek() {
		s.pos++
	}
}

// skipBlank skips spaces, newlines and comments.
func (s *keyScanner) skipBlank() {
	for !s.eof() {
		switch c := s.peek(); c {
		case ' ', '\t', '\r', '\n':
			s.advance(1)
		case '#':
			for !s.eof() && s.peek() != '\n' {
				s.pos++
			}
		default:
			return
		}
	}
}

func (s *keyScanner) document() {
	for {
		s.skipBlank()
		if s.eof() {
			return
		}
		start := s.pos
		switch {
		case s.has("[["):
			s.advance(2)
			s.header(s.key(), true)
			s.skipSpace()
			s.advance(2)
		case s.has("["):
			s.advance(1)
			s.header(s.key(), false)
			s.skipSpace()
			s.advance(1)
		default:
			s.keyValue(s.table)
		}
		if s.pos == start {
			s.advance(1)
		}
	}
}

func (s *keyScanner) header(parts []string, arrayOfTables bool) {
	key := ""
	for i, part := range parts {
		key = joinKey(key, part)
		if arrayOfTables && i == len(parts)-1 {
			n := s.arrays[key]
			s.arrays[key] = n + 1
			s.record(key, s.line)
			key = indexKey(key, n)
		} else if n, ok := s.arrays[key]; ok {
			key = indexKey(key, n-1)
		}
		s.record(key, s.line)
	}
	s.table = key
}

func (s *keyScanner) keyValue(table string) {
	line := s.line
	key := table
	for _, part := range s.key() {
		key = joinKey(key, part)
		s.record(key, line)
	}
	s.skipSpace()
	if s.peek() == '=' {
		s.advance(1)
	}
	s.skipSpace()
	s.value(key)
}

// key reads a dotted key and returns its parts.
func (s *keyScanner) key() []string {
	var parts []string
	for {
		s.skipSpace()
		parts = append(parts, s.keyPart())
		s.skipSpace()
		if s.peek() != '.' {
			return parts
		}
		s.advance(1)
	}
}

func (s *keyScanner) keyPart() string {
	start := s.pos
	switch s.peek() {
	case '"':
		s.skipString('"', true)
		if part, err := strconv.Unquote(s.src[start:s.pos]); err == nil {
			return part
		}
		return strings.Trim(s.src[start:s.pos], `"`)
	case '\'':
		s.skipString('\'', false)
		return strings.Trim(s.src[start:s.pos], "'")
	}
	for !s.eof() && isBareKeyChar(s.peek()) {
		s.pos++
	}
	return s.src[start:s.pos]
}

// skipString skips a single-line string starting at its opening quote.
func (s *keyScanner) skipString(quote byte, escapes bool) {
	s.advance(1)
	for !s.eof() && s.peek() != quote && s.peek() != '\n' {
		if escapes && s.peek() == '\\' {
			s.advance(1)
		}
		s.advance(1)
	}
	s.advance(1)
}

// skipMultiline skips a multi-line string starting at its opening delimiter.
func (s *keyScanner) skipMultiline(delim string, escapes bool) {
	s.advance(3)
	for !s.eof() && !s.has(delim) {
		if escapes && s.peek() == '\\' {
			s.advance(1)
		}
		s.advance(1)
	}
	s.advance(3)
	// Up to two quotes right before the delimiter belong to the content.
	for i := 0; i < 2 && s.peek() == delim[0]; i++ {
		s.advance(1)
	}
}

func (s *keyScanner) value(key string) {
	switch {
	case s.has(`"""`):
		s.skipMultiline(`"""`, true)
	case s.has("'''"):
		s.skipMultiline("'''", false)
	case s.peek() == '"':
		s.skipString('"', true)
	case s.peek() == '\'':
		s.skipString('\'', false)
	case s.peek() == '[':
		s.advance(1)
		for i := 0; ; i++ {
			s.skipBlank()
			if s.eof() || s.peek() == ']' {
				s.advance(1)
				return
			}
			start := s.pos
			elem := indexKey(key, i)
			s.record(elem, s.line)
			s.value(elem)
			s.skipBlank()
			if s.peek() == ',' {
				s.advance(1)
			}
			if s.pos == start {
				s.advance(1)
			}
		}
	case s.peek() == '{':
		s.advance(1)
		for {
			s.skipBlank()
			if s.eof() || s.peek() == '}' {
				s.advance(1)
				return
			}
			start := s.pos
			s.keyValue(key)
			s.skipBlank()
			if s.peek() == ',' {
				s.advance(1)
			}
			if s.pos == start {
				s.advance(1)
			}
		}
	default: // number, boolean, date-time: may contain spaces, never these
		for !s.eof() && !strings.ContainsRune(",]}#\r\n", rune(s.peek())) {
			s.pos++
		}
	}
}

func isBareKeyChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// joinKey appends one part to a key, quoting it when it is not a bare key.
func joinKey(parent, part string) string {
	quoted := part
	bare := part != ""
	for i := 0; i < len(part); i++ {
		bare = bare && isBareKeyChar(part[i])
	}
	if !bare {
		quoted = strconv.Quote(part)
	}
	if parent == "" {
		return quoted
	}
	return parent + "." + quoted
}

func indexKey(key string, i int) string { return key + "[" + strconv.Itoa(i) + "]" }
