package config

import (
	"testing"
)

func TestKeyLinesFindsKeysWhereTheyAreWritten(t *testing.T) {
	t.Parallel()
	doc := `# comment [[agents]]
title = """
[[agents]]
id = "not a key"
"""
[[agents]]
id = 'first' # [[agents]]
[agents.tools]
allow = [
  "a", # "b",
  'c',
]

[[ agents ]]
id = "second"
"quoted key" = 1
container_mode = { network = "none",
  image = "x" }
[providers."my.llm"]
kind = "openai"
x.y.z = 3
when = 1979-05-27 07:32:00Z
after = true
`
	tests := []struct {
		key  string
		line int
	}{
		{"title", 2},
		{"agents", 6},
		{"agents[0]", 6},
		{"agents[0].id", 7},
		{"agents[0].tools", 8},
		{"agents[0].tools.allow", 9},
		{"agents[0].tools.allow[0]", 10},
		{"agents[0].tools.allow[1]", 11},
		{"agents[1]", 14},
		{"agents[1].id", 15},
		{`agents[1]."quoted key"`, 16},
		{"agents[1].container_mode", 17},
		{"agents[1].container_mode.network", 17},
		{"agents[1].container_mode.image", 18},
		{`providers."my.llm"`, 19},
		{`providers."my.llm".kind`, 20},
		{`providers."my.llm".x.y`, 21},
		{`providers."my.llm".x.y.z`, 21},
		{`providers."my.llm".when`, 22},
		{`providers."my.llm".after`, 23},
	}
	lines := keyLines(doc)
	for _, tc := range tests {
		if got, ok := lines[tc.key]; !ok || got != tc.line {
			t.Errorf("line of %s = %d (found: %v), want %d", tc.key, got, ok, tc.line)
		}
	}
	if _, ok := lines["agents[2]"]; ok {
		t.Errorf("keyLines found a third agent inside a string or comment: %v", lines)
	}
}
