package skills

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestParseReadsFrontMatterAndBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		text string
		want Skill
	}{
		{
			name: "Inline_lists_and_quoted_values",
			text: "---\nname: deploy\ndescription: \"How we ship: safely\"\ntriggers: [deploy, 'roll back']\ntools: [shell]\nversion: 2\n---\nRun the smoke tests.\n",
			want: Skill{Name: "deploy", Description: "How we ship: safely", Triggers: []string{"deploy", "roll back"}, Tools: []string{"shell"}, Body: "Run the smoke tests."},
		},
		{
			name: "Block_lists",
			text: "---\ntriggers:\n  - disk\n  - df\ntools:\n  - shell\n---\nbody",
			want: Skill{Triggers: []string{"disk", "df"}, Tools: []string{"shell"}, Body: "body"},
		},
		{
			name: "No_front_matter_is_all_body",
			text: "Just text.",
			want: Skill{Body: "Just text."},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := Parse(tc.text)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Parse = %+v, want %+v", got, tc.want)
			}
		})
	}
	if _, err := Parse("---\nname: x\n"); err == nil {
		t.Error("an unclosed front matter parsed")
	}
}

func TestLoadFindsBothLayoutsAndMatchIgnoresCase(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	write := func(rel, text string) {
		p := filepath.Join(ws, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("skills/disk/SKILL.md", "---\ndescription: disks\ntriggers: [disk, df]\ntools: [shell]\n---\nUse df -h.")
	write("skills/poems.md", "---\nname: haiku\ntriggers: [poem]\ntools: [read_file]\n---\n5-7-5")
	write("skills/notes.txt", "ignored")
	write("skills/empty/README", "ignored: no SKILL.md")
	write("skills/broken.md", "---\nname: broken\n")

	list, errs := Load(ws)
	if len(errs) != 1 {
		t.Errorf("errors = %v, want one for broken.md", errs)
	}
	var names []string
	for _, s := range list {
		names = append(names, s.Name)
	}
	if !reflect.DeepEqual(names, []string{"disk", "haiku"}) {
		t.Fatalf("skills = %v, want [disk haiku]", names)
	}
	tests := []struct {
		text      string
		want      []string
		wantTools []string
	}{
		{"How full is the DISK?", []string{"disk"}, []string{"shell"}},
		{"write a Poem about df", []string{"disk", "haiku"}, []string{"shell", "read_file"}},
		{"hello", nil, nil},
	}
	for _, tc := range tests {
		var got []string
		active := Match(list, tc.text)
		for _, s := range active {
			got = append(got, s.Name)
		}
		tools, _ := Tools(active)
		if !reflect.DeepEqual(got, tc.want) || !reflect.DeepEqual(tools, tc.wantTools) {
			t.Errorf("Match(%q) = %v with tools %v, want %v with %v", tc.text, got, tools, tc.want, tc.wantTools)
		}
	}
	if list, errs := Load(t.TempDir()); list != nil || errs != nil {
		t.Errorf("a workspace without skills/ gave %v, %v", list, errs)
	}
}
