package scheduler

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/isolation"
)

// fill sets every field v reaches to a value that is not zero, so that a
// field encodes whatever its omitempty says.
func fill(v reflect.Value, name string) {
	switch v.Kind() {
	case reflect.String:
		v.SetString("v-" + name)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), name)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0), name)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, name+".key")
		fill(e, name)
		v.SetMapIndex(k, e)
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Type().Field(i); f.IsExported() {
				fill(v.Field(i), name+"."+f.Name)
			}
		}
	}
}

func jsonTree(t *testing.T, v any) any {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var tree any
	if err := json.Unmarshal(data, &tree); err != nil {
		t.Fatal(err)
	}
	return tree
}

// The plan on the bus is the whole plan the admin is shown (berthctl,
// Cockpit): a field added to isolation.Plan, or to anything in it, fails
// here until busapi carries it too.
func TestThePlanOnTheBusIsTheWholeRedactedPlan(t *testing.T) {
	t.Parallel()
	var p isolation.Plan
	fill(reflect.ValueOf(&p).Elem(), "plan")
	want, got := jsonTree(t, p.Redacted()), jsonTree(t, busPlan(p))
	if !reflect.DeepEqual(got, want) {
		gotJSON, _ := json.MarshalIndent(got, "", " ")
		wantJSON, _ := json.MarshalIndent(want, "", " ")
		t.Fatalf("the bus plan differs from the redacted plan:\n--- bus\n%s\n--- plan\n%s", gotJSON, wantJSON)
	}
}

// busPlan has no field for a key or a secret's value: even a plan that was
// not redacted cannot put one on the bus.
func TestThePlanOnTheBusCannotCarryAKeyOrASecret(t *testing.T) {
	t.Parallel()
	var p isolation.Plan
	fill(reflect.ValueOf(&p).Elem(), "plan")
	p.Providers[0].Key = "provider-key-SECRET"
	p.Egress.Providers[0].Key = "egress-key-SECRET"
	p.Egress.Secrets[0].Value = "secret-value-SECRET"
	data, err := json.Marshal(busPlan(p))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "SECRET") {
		t.Fatalf("the bus plan carries a secret: %s", data)
	}
}

// berthctl tells a container plan by busapi's names for the backends.
func TestTheBusNamesTheBackendsAsIsolationDoes(t *testing.T) {
	t.Parallel()
	for bus, iso := range map[string]isolation.BackendKind{
		busapi.BackendLandlock: isolation.BackendLandlock, busapi.BackendContainer: isolation.BackendContainer, busapi.BackendUnrestricted: isolation.BackendUnrestricted,
	} {
		if bus != string(iso) {
			t.Errorf("busapi names backend %q %q", iso, bus)
		}
	}
}

// ExplainEgress's verdict and a run's egress decisions and counts reach
// the bus with every field the proxy's decision has.
func TestTheEgressAnswersOnTheBusCarryEveryFieldOfTheProxysDecision(t *testing.T) {
	t.Parallel()
	var v isolation.EgressVerdict
	fill(reflect.ValueOf(&v).Elem(), "verdict")
	got := jsonTree(t, busVerdict(v, "alpha", "none")).(map[string]any)
	delete(got, "agent")
	delete(got, "network")
	if want := jsonTree(t, v); !reflect.DeepEqual(got, want) {
		t.Errorf("the bus verdict is %v, want the proxy's %v", got, want)
	}

	var r Run
	fill(reflect.ValueOf(&r.Egress).Elem(), "egress")
	fill(reflect.ValueOf(&r.EgressCounts).Elem(), "counts")
	for _, tc := range []struct {
		name     string
		wire     string
		recorded any
	}{{"egress", egressJSON(r), r.Egress}, {"egress_counts", egressCountsJSON(r), r.EgressCounts}} {
		var got any
		if err := json.Unmarshal([]byte(tc.wire), &got); err != nil {
			t.Fatal(err)
		}
		if want := jsonTree(t, tc.recorded); !reflect.DeepEqual(got, want) {
			t.Errorf("%s on the bus is %s, want what the record holds %v", tc.name, tc.wire, want)
		}
	}
}
