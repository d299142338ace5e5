// Package skills loads an agent's skills from its workspace and picks the
// ones a message triggers.
//
// A skill is skills/<name>/SKILL.md or skills/<name>.md: Markdown with a
// front matter block.
//
//	---
//	name: deploy
//	description: How we deploy the web app
//	triggers: [deploy, release, "roll back"]
//	tools: [shell, read_file]
//	---
//	Body: instructions that join the system prompt when the skill is active.
//
// triggers match as case-insensitive substrings of the message; a skill
// without triggers is never active (it is still listed to the model). tools,
// when given, restricts the agent's tools while the skill is active (to the
// union over all active skills, and never beyond the agent's allow/deny).
// Lists are written [a, b] or as "- item" lines; name defaults to the file
// or directory name.
package skills

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Dir is the skills directory inside the workspace.
const Dir = "skills"

// MaxSkillSize caps one skill file.
const MaxSkillSize = 64 << 10

// Skill is one loaded skill.
type Skill struct {
	Name        string
	Description string
	Triggers    []string
	Tools       []string
	Body        string
	Path        string
}

// Load reads every skill under workspace/skills, sorted by name. A missing
// directory is no skills; a skill file that cannot be read or parsed is
// reported in errs and left out.
func Load(workspace string) (list []Skill, errs []error) {
	root := filepath.Join(workspace, Dir)
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, []error{fmt.Errorf("cannot list skills: %w", err)}
	}
	for _, e := range entries {
		var path, name string
		switch {
		case e.IsDir():
			path, name = filepath.Join(root, e.Name(), "SKILL.md"), e.Name()
			if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
				continue
			}
		case strings.HasSuffix(e.Name(), ".md"):
			path, name = filepath.Join(root, e.Name()), strings.TrimSuffix(e.Name(), ".md")
		default:
			continue
		}
		s, err := read(path, name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		list = append(list, s)
	}
	sort.SliceStable(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	return list, errs
}

func read(path, name string) (Skill, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Skill{}, fmt.Errorf("cannot read skill %s: %w", path, err)
	}
	if len(data) > MaxSkillSize {
		return Skill{}, fmt.Errorf("skill %s is larger than %d bytes", path, MaxSkillSize)
	}
	s, err := Parse(string(data))
	if err != nil {
		return Skill{}, fmt.Errorf("cannot parse skill %s: %w", path, err)
	}
	if s.Name == "" {
		s.Name = name
	}
	s.Path = path
	return s, nil
}

// Parse reads a skill file: an optional front matter block and the body.
func Parse(text string) (Skill, error) {
	text = strings.ReplaceAll(text, "\r\n", "\n")
	var s Skill
	if !strings.HasPrefix(text, "---\n") {
		s.Body = strings.TrimSpace(text)
		return s, nil
	}
	front, body, ok := strings.Cut(text[4:], "\n---")
	if !ok {
		return s, errors.New("front matter has no closing ---")
	}
	if i := strings.IndexByte(body, '\n'); i >= 0 {
		body = body[i+1:]
	} else {
		body = ""
	}
	s.Body = strings.TrimSpace(body)

	var listKey string
	for n, line := range strings.Split(front, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if item, ok := strings.CutPrefix(trimmed, "- "); ok && listKey != "" {
			if err := s.set(listKey, []string{unquote(item)}, true); err != nil {
				return s, fmt.Errorf("front matter line %d: %w", n+2, err)
			}
			continue
		}
		key, value, ok := strings.Cut(trimmed, ":")
		if !ok {
			return s, fmt.Errorf("front matter line %d: want key: value", n+2)
		}
		key, value = strings.ToLower(strings.TrimSpace(key)), strings.TrimSpace(value)
		listKey = key
		var values []string
		if strings.HasPrefix(value, "[") && strings.HasSuffix(value, "]") {
			for _, v := range strings.Split(value[1:len(value)-1], ",") {
				if v = unquote(v); v != "" {
					values = append(values, v)
				}
			}
		} else if value != "" {
			values = []string{unquote(value)}
		}
		if err := s.set(key, values, false); err != nil {
			return s, fmt.Errorf("front matter line %d: %w", n+2, err)
		}
	}
	return s, nil
}

func (s *Skill) set(key string, values []string, appendItem bool) error {
	switch key {
	case "name", "description":
		if appendItem {
			return fmt.Errorf("%s is not a list", key)
		}
		v := strings.Join(values, ", ")
		if key == "name" {
			s.Name = v
		} else {
			s.Description = v
		}
	case "triggers":
		s.Triggers = append(s.Triggers, values...)
	case "tools":
		s.Tools = append(s.Tools, values...)
	default:
		// Unknown keys (version, author, ...) are ignored so skills written
		// for other gateways still load.
	}
	return nil
}

func unquote(v string) string {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && (v[0] == '"' && v[len(v)-1] == '"' || v[0] == '\'' && v[len(v)-1] == '\'') {
		v = v[1 : len(v)-1]
	}
	return strings.TrimSpace(v)
}

// Match returns the skills with a trigger that is a case-insensitive
// substring of text, in list order.
func Match(list []Skill, text string) []Skill {
	lower := strings.ToLower(text)
	var out []Skill
	for _, s := range list {
		if slices.ContainsFunc(s.Triggers, func(t string) bool {
			return t != "" && strings.Contains(lower, strings.ToLower(t))
		}) {
			out = append(out, s)
		}
	}
	return out
}

// Tools is the union of the active skills' tools lists; ok is false when
// no active skill restricts tools.
func Tools(active []Skill) (names []string, ok bool) {
	for _, s := range active {
		if len(s.Tools) == 0 {
			continue
		}
		ok = true
		for _, t := range s.Tools {
			if !slices.Contains(names, t) {
				names = append(names, t)
			}
		}
	}
	return names, ok
}
