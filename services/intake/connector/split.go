package connector

import (
	"strings"
	"unicode/utf8"
)

// Split cuts text into chunks of at most limit characters (runes: what the
// platforms count), so that no chunk ends inside a UTF-8 sequence and none
// leaves a fenced code block open: a block cut across chunks is closed at the
// end of one chunk and reopened, with its info string, at the start of the
// next. It cuts at line ends where it can, then at spaces, then anywhere.
// Empty text gives no chunks.
func Split(text string, limit int) []string {
	if text == "" {
		return nil
	}
	if limit < 16 {
		limit = 16
	}
	if utf8.RuneCountInString(text) <= limit {
		return []string{text}
	}
	s := splitter{limit: limit}
	lines := strings.SplitAfter(text, "\n")
	for _, line := range lines {
		s.addLine(line)
	}
	s.flush(false)
	return s.chunks
}

type splitter struct {
	limit  int
	chunks []string
	cur    strings.Builder
	n      int    // runes in cur
	fence  string // the opening line of the fenced block we are in ("```go"), or ""
	marker string // its fence characters ("```", "~~~~")
}

// room is how many runes the current chunk can still take, keeping space to
// close an open fence.
func (s *splitter) room() int {
	r := s.limit - s.n
	if s.fence != "" {
		r -= 1 + utf8.RuneCountInString(s.marker) // "\n```"
	}
	return r
}

func (s *splitter) write(str string) {
	s.cur.WriteString(str)
	s.n += utf8.RuneCountInString(str)
}

// flush ends the current chunk; reopen says whether the next one continues
// inside the open fence.
func (s *splitter) flush(reopen bool) {
	if s.n == 0 {
		return
	}
	chunk := s.cur.String()
	if s.fence != "" && reopen {
		chunk = strings.TrimSuffix(chunk, "\n") + "\n" + s.marker
	}
	s.chunks = append(s.chunks, strings.TrimRight(chunk, "\n"))
	s.cur.Reset()
	s.n = 0
	if s.fence != "" && reopen {
		s.write(s.fence + "\n")
	}
}

func (s *splitter) addLine(line string) {
	trimmed := strings.TrimSpace(line)
	isFence := false
	if m := fenceMarker(trimmed); m != "" {
		switch {
		case s.fence == "":
			isFence = true
			defer func() { s.fence, s.marker = strings.TrimRight(line, "\n"), m }()
		case strings.HasPrefix(m, s.marker[:1]) && len(m) >= len(s.marker) && trimmed == m:
			isFence = true
			defer func() { s.fence, s.marker = "", "" }()
		}
	}
	n := utf8.RuneCountInString(line)
	if isFence && s.fence == "" {
		// An opening fence needs room for itself, one more line and its
		// closing; otherwise start it in the next chunk.
		if n+1+utf8.RuneCountInString(fenceMarker(trimmed))+2 > s.room() {
			s.flush(false)
		}
		s.write(line)
		return
	}
	if isFence {
		// A closing fence always fits: room() kept space for it.
		s.write(line)
		return
	}
	for line != "" {
		r := s.room()
		if n <= r {
			s.write(line)
			return
		}
		if s.n > 0 && s.n > s.openedWith() && n <= s.limit-s.openedWith()-s.closeCost() {
			// The line fits in a fresh chunk: cut before it.
			s.flush(true)
			continue
		}
		if r <= 0 {
			s.flush(true)
			continue
		}
		head, tail := cutRunes(line, r)
		s.write(head)
		s.flush(true)
		line = tail
		n = utf8.RuneCountInString(line)
	}
}

// openedWith is the size of the reopened fence at the start of a chunk.
func (s *splitter) openedWith() int {
	if s.fence == "" {
		return 0
	}
	return utf8.RuneCountInString(s.fence) + 1
}

func (s *splitter) closeCost() int {
	if s.fence == "" {
		return 0
	}
	return 1 + utf8.RuneCountInString(s.marker)
}

// cutRunes cuts line to at most max runes, at the last space when there is
// one in the second half, else at max runes.
func cutRunes(line string, max int) (string, string) {
	i, count := 0, 0
	for i < len(line) && count < max {
		_, size := utf8.DecodeRuneInString(line[i:])
		i += size
		count++
	}
	head := line[:i]
	if sp := strings.LastIndexByte(head, ' '); sp > len(head)/2 {
		return line[:sp+1], line[sp+1:]
	}
	return head, line[i:]
}

// fenceMarker returns the run of ``` or ~~~ (three or more) a trimmed line
// starts with, or "".
func fenceMarker(trimmed string) string {
	for _, c := range []byte{'`', '~'} {
		n := 0
		for n < len(trimmed) && trimmed[n] == c {
			n++
		}
		if n >= 3 {
			return trimmed[:n]
		}
	}
	return ""
}
