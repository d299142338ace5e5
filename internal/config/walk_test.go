package config

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// walkDoc is a table of every kind the walker knows, so its tests do not
// depend on berth.toml's own keys.
type walkDoc struct {
	Name    string             `toml:"name" berth:"check=nonEmpty"`
	Size    *Bytes             `toml:"size" berth:"check=memoryLimit"`
	UIDs    *UIDRange          `toml:"uids"`
	Tags    []string           `toml:"tags" berth:"check=nonEmpty"`
	Ports   []int              `toml:"ports" berth:"check=port"`
	Vars    map[string]string  `toml:"vars"`
	Wait    *Duration          `toml:"wait"`
	Mode    NetworkMode        `toml:"mode"`
	Steps   []walkStep         `toml:"steps"`
	Inner   walkInner          `toml:"inner"`
	Default *entry[walkItem]   `toml:"default" berth:"omit=id"`
	Items   []*entry[walkItem] `toml:"items" berth:"merge=id"`
	Log     []*entry[walkItem] `toml:"log"`
	Named   walkNamed          `toml:"named"`
}

type walkInner struct {
	N    *int  `toml:"n" berth:"check=atLeastOne"`
	Flag *bool `toml:"flag"`
}

type walkNamed struct {
	Own  string             `toml:"own"`
	Rest []*entry[walkItem] `berth:"rest=widget"`
}

type walkStep struct {
	Run  string            `toml:"run" berth:"check=nonEmpty"`
	Env  map[string]string `toml:"env"`
	Tags []string          `toml:"tags"`
}

type walkItem struct {
	Label string `berth:"name"`
	ID    string `toml:"id"`
	Value string `toml:"value"`
}

// decodeWalkDoc decodes one file's text into a walkDoc entry.
func decodeWalkDoc(t *testing.T, file, text string) (*entry[walkDoc], Errors) {
	t.Helper()
	var raw map[string]any
	if _, err := toml.Decode(text, &raw); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	e := newEntry(reflect.TypeFor[*entry[walkDoc]](), loc{}).(*entry[walkDoc])
	allocateEntries(e.value())
	d := &decoder{file: file, lines: keyLines(text)}
	d.decodeTable(keyPath{}, raw, e.value(), e.at, "", nil)
	return e, d.errs
}

func TestWalkerMergesWhatALaterFileSetsAndKeepsWhereItCameFrom(t *testing.T) {
	t.Parallel()
	first, errs := decodeWalkDoc(t, "a.toml", `name = "first"
size = "1g"
tags = ["x", "y"]
vars = { A = "1", B = "2" }
wait = "90s"
mode = "none"
[[steps]]
run = "one"
env = { X = "1" }
[[steps]]
run = "two"
[inner]
n = 3
[default]
value = "d1"
[[items]]
id = "x"
value = "1"
[[log]]
value = "one"
[named.one]
value = "n1"
`)
	if len(errs) > 0 {
		t.Fatalf("a.toml: %v", errs)
	}
	second, errs := decodeWalkDoc(t, "b.toml", `name = "second"
uids = "200000-200009"
vars = { C = "3" }
steps = [{ run = "only", tags = ["t"] }]
[inner]
flag = true
[[items]]
id = "x"
value = "2"
[[items]]
id = "y"
[[log]]
value = "two"
[named.one]
id = "late"
[named.two]
value = "n2"
`)
	if len(errs) > 0 {
		t.Fatalf("b.toml: %v", errs)
	}
	merged := newEntry(reflect.TypeFor[*entry[walkDoc]](), loc{}).(*entry[walkDoc])
	allocateEntries(merged.value())
	mergeEntry(merged, first)
	mergeEntry(merged, second)

	m := &merged.v
	if m.Name != "second" || m.Size == nil || *m.Size != 1<<30 || m.UIDs == nil || *m.UIDs != (UIDRange{First: 200000, Last: 200009}) {
		t.Errorf("scalars: name %q size %v uids %v; want the later name, the earlier size and the later range", m.Name, m.Size, m.UIDs)
	}
	if !reflect.DeepEqual(m.Tags, []string{"x", "y"}) || !reflect.DeepEqual(m.Vars, map[string]string{"C": "3"}) {
		t.Errorf("tags %q vars %v; want the earlier tags and the later vars only (a table of strings is replaced whole)", m.Tags, m.Vars)
	}
	if m.Wait == nil || *m.Wait != Duration(90*time.Second) || m.Mode != "none" {
		t.Errorf("wait %v mode %q; want a.toml's 90s and none", m.Wait, m.Mode)
	}
	if want := []walkStep{{Run: "only", Tags: []string{"t"}}}; !reflect.DeepEqual(m.Steps, want) {
		t.Errorf("steps = %+v, want %+v (an array of tables inside a table is replaced whole)", m.Steps, want)
	}
	if m.Inner.N == nil || *m.Inner.N != 3 || m.Inner.Flag == nil || !*m.Inner.Flag {
		t.Errorf("inner = %+v; want n from a.toml and flag from b.toml", m.Inner)
	}
	if m.Default.v.Value != "d1" || m.Default.self.file != "a.toml" {
		t.Errorf("default = %+v at %+v; want a.toml's", m.Default.v, m.Default.self)
	}
	var items []string
	for _, e := range m.Items {
		items = append(items, e.v.ID+"="+e.v.Value+"@"+e.self.file)
	}
	if want := []string{"x=2@a.toml", "y=@b.toml"}; !reflect.DeepEqual(items, want) {
		t.Errorf("items = %q, want %q (merged by id, each where it was first defined)", items, want)
	}
	if len(m.Log) != 2 || m.Log[1].v.Value != "two" {
		t.Errorf("log has %d entries, want both files' (a list without merge= appends)", len(m.Log))
	}
	var named []string
	for _, e := range m.Named.Rest {
		named = append(named, e.v.Label+":"+e.v.ID+"/"+e.v.Value)
	}
	if want := []string{"one:late/n1", "two:/n2"}; !reflect.DeepEqual(named, want) {
		t.Errorf("named = %q, want %q (merged by name)", named, want)
	}

	for key, want := range map[string]string{
		"name": "b.toml:1", "size": "a.toml:2", "uids": "b.toml:2", "tags": "a.toml:3",
		"vars": "b.toml:3", "vars.C": "b.toml:3", "inner.n": "a.toml:13", "inner.flag": "b.toml:6",
		"wait": "a.toml:5", "steps": "b.toml:4", "steps[0].run": "b.toml:4", "steps[0].tags": "b.toml:4",
	} {
		l, ok := merged.at[key]
		if got := l.file + ":" + strconv.Itoa(l.line); !ok || got != want {
			t.Errorf("location of %s = %s (set: %v), want %s", key, got, ok, want)
		}
	}
	for _, gone := range []string{"vars.A", "vars.B", "ports", "steps[1]", "steps[1].run", "steps[0].env", "steps[0].env.X"} {
		if l, ok := merged.at[gone]; ok {
			t.Errorf("%s is located at %+v, want it unset", gone, l)
		}
	}
	if l := m.Items[0].at["value"]; l.file != "b.toml" || l.line != 9 || l.key != "items[0].value" {
		t.Errorf("items[0].value is at %+v, want b.toml:9 under its key in b.toml", l)
	}
}

func TestWalkerReportsEachBadKeyAtItsFileLineAndKey(t *testing.T) {
	t.Parallel()
	_, errs := decodeWalkDoc(t, "a.toml", `name = ""
size = "1k"
uids = "5-1"
tags = ["ok", 7]
ports = [80, 70000]
vars = { A = 1 }
wait = "-5s"
mode = "host"
[[steps]]
run = ""
[[steps]]
bogus = 1
[inner]
n = 0
typo = 1
[default]
id = "x"
[[items]]
value = true
[named]
own = "fine"
stray = 1
[named.one]
bogus = "x"
`)
	want := []string{
		`a.toml:1: name: must not be empty`,
		`a.toml:2: size: "1k" is below the minimum of 6m`,
		`a.toml:3: uids: invalid uid range "5-1": 5 is above 1`,
		`a.toml:4: tags[1]: must be a string, not an integer`,
		`a.toml:5: ports[1]: port 70000 is not 1-65535`,
		`a.toml:6: vars.A: must be a string, not an integer`,
		`a.toml:7: wait: invalid duration "-5s": want a number with a unit s, m or h, like 30m or 1h30m`,
		`a.toml:8: mode: "host" would share the host's network stack (and its local services) with the agent; use "bridge" or "none"`,
		`a.toml:10: steps[0].run: must not be empty`,
		`a.toml:12: steps[1].bogus: unknown key (known keys: env, run, tags)`,
		`a.toml:14: inner.n: must be at least 1, not 0`,
		`a.toml:15: inner.typo: unknown key (known keys: flag, n)`,
		`a.toml:17: default.id: unknown key (known keys: value)`,
		`a.toml:19: items[0].value: must be a string, not a boolean`,
		`a.toml:22: named.stray: unknown key (known keys: own; a widget is a table, [named.stray])`,
		`a.toml:24: named.one.bogus: unknown key (known keys: id, value)`,
	}
	sortErrors(errs, []string{"a.toml"})
	var got []string
	for _, e := range errs {
		got = append(got, e.Error())
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestEveryTableIsWalkable reads the tags of every table of berth.toml, so a
// tag naming a check that does not exist, or a field of a kind the walker
// cannot decode, fails here rather than on an admin's machine.
func TestEveryTableIsWalkable(t *testing.T) {
	t.Parallel()
	seen := map[reflect.Type]bool{}
	var walk func(reflect.Type)
	walk = func(typ reflect.Type) {
		if seen[typ] {
			return
		}
		seen[typ] = true
		for _, f := range specsOf(typ) {
			ft := f.typ
			switch f.kind {
			case kindSection:
				walk(ft)
			case kindTables:
				walk(ft.Elem())
			case kindEntry:
				walk(ft.Elem().Field(0).Type)
			case kindEntries:
				walk(ft.Elem().Elem().Field(0).Type)
			case kindLeaf, kindList:
				if ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
					ft = ft.Elem()
				}
				if _, ok := tomlWants[ft.Kind()]; !ok && !reflect.PointerTo(ft).Implements(textUnmarshalerType) {
					t.Errorf("%s.%s: the walker decodes no TOML value into %s", typ.Name(), f.key, ft)
				}
			case kindStrings:
				if ft != reflect.TypeFor[map[string]string]() {
					t.Errorf("%s.%s: a table of strings must be map[string]string, not %s", typ.Name(), f.key, ft)
				}
			}
		}
	}
	walk(reflect.TypeFor[document]())
	if !seen[reflect.TypeFor[ContainerSettings]()] || !seen[reflect.TypeFor[EgressSecret]()] {
		t.Errorf("the walk missed tables; saw %v", seen)
	}
}

// TestCredentialKeysAreTheOnesCallersName holds the credential keys read from
// Connector's tags against the constants intake passes to Credential.
func TestCredentialKeysAreTheOnesCallersName(t *testing.T) {
	t.Parallel()
	if want := []string{CredToken, CredAppToken, CredBotToken, CredSigningSecret}; !reflect.DeepEqual(credentialKeys, want) {
		t.Errorf("credential keys = %q, want %q", credentialKeys, want)
	}
	k := Connector{Token: "t", AppToken: "a", BotToken: "b", SigningSecret: "s"}
	for key, want := range map[string]string{CredToken: "t", CredAppToken: "a", CredBotToken: "b", CredSigningSecret: "s"} {
		if got, err := k.CredentialRef(key); err != nil || got != want {
			t.Errorf("CredentialRef(%s) = %q, %v; want %q", key, got, err, want)
		}
	}
	if _, err := k.CredentialRef("secret"); err == nil {
		t.Error("CredentialRef(secret) succeeded; a webhook's secret is not a credential reference")
	}
}
