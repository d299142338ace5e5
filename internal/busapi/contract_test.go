package busapi

import (
	"encoding/xml"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/godbus/dbus/v5/introspect"
)

// clientOf is the typed client of each interface the units/dbus XML
// declares. An interface missing here fails the test.
var clientOf = map[string]reflect.Type{
	"dev.berth.Scheduler1":  reflect.TypeFor[Scheduler](),
	"dev.berth.Intake1":     reflect.TypeFor[Intake](),
	"dev.berth.Images1":     reflect.TypeFor[Images](),
	"dev.berth.Images1.Job": reflect.TypeFor[*BuildJob](),
	"dev.berth.Metrics1":    reflect.TypeFor[Metrics](),
}

// clientOnly are the client methods that stand for no one method of the
// XML: Properties reads the interface's properties, Follow its signals,
// ExplainGit asks ExplainEgress a git question.
var clientOnly = []string{"Properties", "Follow", "ExplainGit"}

func TestEveryMethodInTheXMLHasAClientMethodAndNoClientMethodIsMissingFromIt(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../../units/dbus/*.xml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no interface XML found (%v)", err)
	}
	seen := map[string]bool{}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var node introspect.Node
		if err := xml.Unmarshal(data, &node); err != nil {
			t.Fatalf("cannot parse %s: %v", file, err)
		}
		for _, iface := range node.Interfaces {
			seen[iface.Name] = true
			client, ok := clientOf[iface.Name]
			if !ok {
				t.Errorf("%s: interface %s has no typed client", filepath.Base(file), iface.Name)
				continue
			}
			declared := map[string]bool{}
			for _, m := range iface.Methods {
				declared[m.Name] = true
				if _, ok := client.MethodByName(m.Name); !ok {
					t.Errorf("%s: method %s.%s has no client method %s.%s", filepath.Base(file), iface.Name, m.Name, client, m.Name)
				}
			}
			for _, s := range iface.Signals {
				declared[s.Name] = true
			}
			for i := range client.NumMethod() {
				name := client.Method(i).Name
				if !declared[name] && !slices.Contains(clientOnly, name) {
					t.Errorf("client method %s.%s is in no method or signal of %s", client, name, iface.Name)
				}
			}
		}
	}
	for name := range clientOf {
		if !seen[name] {
			t.Errorf("client of %s, but no XML declares it", name)
		}
	}
}
