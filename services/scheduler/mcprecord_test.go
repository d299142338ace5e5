package scheduler

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
)

func TestARunsMCPServersOnTheBusCarryEveryFieldTheRecordHolds(t *testing.T) {
	t.Parallel()
	var r Run
	fill(reflect.ValueOf(&r.MCP).Elem(), "mcp")
	var got any
	if err := json.Unmarshal([]byte(mcpJSON(r)), &got); err != nil {
		t.Fatal(err)
	}
	if want := jsonTree(t, r.MCP); !reflect.DeepEqual(got, want) {
		t.Errorf("mcp on the bus is %v, want what the record holds %v", got, want)
	}
	if got := mcpJSON(Run{}); got != "[]" {
		t.Errorf("a run without MCP servers shows %q, want []", got)
	}
}

func TestTheRecordKeepsAnMCPErrorLineAsValidText(t *testing.T) {
	t.Parallel()
	got := recordedMCP([]agentproto.MCPStatus{{Name: "files", Transport: "stdio", Error: "did not start: \x00\xff"}})
	if len(got) != 1 || got[0].Error != "did not start: \uFFFD\uFFFD" {
		t.Errorf("recorded %+v, want the NUL and the invalid byte replaced", got)
	}
}
