// Package memory is an agent's long-term memory: facts stored in the
// workspace's memory.db and found again by relevance.
//
// memory.db is a JSON-lines file, one fact per line:
//
//	{"id":"m1a2b3c4","content":"...","source":"...","created_at":"2025-01-02T03:04:05Z"}
//
// Adding a fact appends one line and syncs the file; deleting rewrites the
// file through a temporary file and a rename. A torn last line (a crash in
// the middle of an append) is skipped when reading. Writes take the
// workspace's shared-files lock (LockShared): conversations of one agent may
// run at once (issue 22). Search ranks with BM25 (k1 1.2,
// b 0.75) over lower-cased words, with a light plural folding.
package memory

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
	"unicode"
)

// FileName is the store's file name inside the workspace.
const FileName = "memory.db"

// MaxContent is the largest fact stored.
const MaxContent = 8 << 10

// Fact is one stored memory.
type Fact struct {
	ID        string    `json:"id"`
	Content   string    `json:"content"`
	Source    string    `json:"source,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// Result is a fact found by Search, with its BM25 score.
type Result struct {
	Fact
	Score float64 `json:"score"`
}

// Store is one memory.db file.
type Store struct {
	path string
	now  func() time.Time
}

// Open returns the store at path; the file is created by the first Add.
func Open(path string) *Store {
	return &Store{path: path, now: time.Now}
}

// Add stores a fact and returns it with its id.
func (s *Store) Add(content, source string) (Fact, error) {
	content = strings.TrimSpace(content)
	if content == "" {
		return Fact{}, errors.New("content is empty")
	}
	if len(content) > MaxContent {
		return Fact{}, fmt.Errorf("content is %d bytes; at most %d fit in one memory", len(content), MaxContent)
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	f := Fact{ID: "m" + hex.EncodeToString(id[:]), Content: content, Source: strings.TrimSpace(source), CreatedAt: s.now().UTC().Truncate(time.Second)}
	line, err := json.Marshal(f)
	if err != nil {
		return Fact{}, fmt.Errorf("cannot encode memory: %w", err)
	}
	unlock, err := LockShared(filepath.Dir(s.path))
	if err != nil {
		return Fact{}, err
	}
	defer unlock()
	file, err := os.OpenFile(s.path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return Fact{}, fmt.Errorf("cannot open %s: %w", FileName, err)
	}
	defer file.Close()
	// After a torn append the file does not end in a newline: start a new line.
	if info, err := file.Stat(); err == nil && info.Size() > 0 {
		last := make([]byte, 1)
		if _, err := file.ReadAt(last, info.Size()-1); err == nil && last[0] != '\n' {
			line = append([]byte{'\n'}, line...)
		}
	}
	if _, err := file.Write(append(line, '\n')); err != nil {
		return Fact{}, fmt.Errorf("cannot write %s: %w", FileName, err)
	}
	if err := file.Sync(); err != nil {
		return Fact{}, fmt.Errorf("cannot sync %s: %w", FileName, err)
	}
	return f, nil
}

// All returns every stored fact, oldest first.
func (s *Store) All() ([]Fact, error) {
	data, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", FileName, err)
	}
	// The whole file is in memory already: split it rather than scan, so no
	// line is too long to read and no fact after a long one is lost. Only a
	// line that is not a fact (a torn last append) is skipped.
	var facts []Fact
	for _, line := range bytes.Split(data, []byte("\n")) {
		var f Fact
		if json.Unmarshal(line, &f) == nil && f.ID != "" {
			facts = append(facts, f)
		}
	}
	return facts, nil
}

// Delete removes the fact with id; found is false when there is none.
func (s *Store) Delete(id string) (found bool, err error) {
	unlock, err := LockShared(filepath.Dir(s.path))
	if err != nil {
		return false, err
	}
	defer unlock()
	facts, err := s.All()
	if err != nil {
		return false, err
	}
	var buf bytes.Buffer
	for _, f := range facts {
		if f.ID == id {
			found = true
			continue
		}
		line, _ := json.Marshal(f)
		buf.Write(append(line, '\n'))
	}
	if !found {
		return false, nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(s.path), ".memory-*.tmp")
	if err != nil {
		return false, fmt.Errorf("cannot rewrite %s: %w", FileName, err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(buf.Bytes())
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), s.path)
	}
	if err != nil {
		return false, fmt.Errorf("cannot rewrite %s: %w", FileName, err)
	}
	return true, nil
}

// Search returns up to limit facts that share words with query, the most
// relevant first (BM25; ties: newer first).
func (s *Store) Search(query string, limit int) ([]Result, error) {
	facts, err := s.All()
	if err != nil {
		return nil, err
	}
	return Rank(facts, query, limit), nil
}

// BM25 parameters.
const (
	k1 = 1.2
	b  = 0.75
)

// Rank scores facts against query with BM25 and returns the best limit.
func Rank(facts []Fact, query string, limit int) []Result {
	terms := uniq(Tokenize(query))
	if len(terms) == 0 || len(facts) == 0 || limit <= 0 {
		return nil
	}
	docs := make([]map[string]int, len(facts))
	lengths := make([]int, len(facts))
	df := map[string]int{}
	total := 0
	for i, f := range facts {
		tokens := Tokenize(f.Content + " " + f.Source)
		docs[i] = map[string]int{}
		for _, t := range tokens {
			docs[i][t]++
		}
		for t := range docs[i] {
			df[t]++
		}
		lengths[i] = len(tokens)
		total += len(tokens)
	}
	n := float64(len(facts))
	avg := float64(total) / n
	if avg == 0 {
		avg = 1
	}
	var results []Result
	for i, f := range facts {
		score := 0.0
		for _, t := range terms {
			tf := float64(docs[i][t])
			if tf == 0 {
				continue
			}
			idf := math.Log(1 + (n-float64(df[t])+0.5)/(float64(df[t])+0.5))
			score += idf * tf * (k1 + 1) / (tf + k1*(1-b+b*float64(lengths[i])/avg))
		}
		if score > 0 {
			results = append(results, Result{Fact: f, Score: math.Round(score*1000) / 1000})
		}
	}
	sort.SliceStable(results, func(i, j int) bool {
		if results[i].Score != results[j].Score {
			return results[i].Score > results[j].Score
		}
		return results[i].CreatedAt.After(results[j].CreatedAt)
	})
	if len(results) > limit {
		results = results[:limit]
	}
	return results
}

// Tokenize splits text into lower-case words of letters and digits and
// folds simple plurals ("backups" → "backup", "entries" → "entry").
func Tokenize(text string) []string {
	words := strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	})
	for i, w := range words {
		switch {
		case len(w) > 4 && strings.HasSuffix(w, "ies"):
			words[i] = w[:len(w)-3] + "y"
		case len(w) > 3 && strings.HasSuffix(w, "s") && !strings.HasSuffix(w, "ss") && !strings.HasSuffix(w, "us"):
			words[i] = w[:len(w)-1]
		}
	}
	return words
}

func uniq(words []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, w := range words {
		if !seen[w] {
			seen[w] = true
			out = append(out, w)
		}
	}
	return out
}
