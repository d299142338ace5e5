package ctl

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/services/scheduler"
)

// runsSchedulerOnBus runs a real scheduler (no backends: its runs stay queued)
// on a private bus, its store in dir, and returns a cli connected to it.
func runsSchedulerOnBus(t *testing.T, dir string) (*cli, *scheduler.Service, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	_, err := exec.LookPath("dbus-daemon")
	testenv.Need(t, err == nil, "dbus-daemon is not installed")
	b := testbus.Start(t, testbus.Options{})
	cfg := &config.Config{Agents: []config.AgentSettings{{ID: "alpha"}}}
	s, err := scheduler.New(cfg, dir, scheduler.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Export(b.Conn(t)); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	return &cli{out: &out, errOut: &errOut, conn: b.Conn(t)}, s, &out, &errOut
}

func TestRunsListPagesThroughEveryRun(t *testing.T) {
	t.Parallel()
	c, s, out, errOut := runsSchedulerOnBus(t, t.TempDir())
	var ids []string
	for i := range 7 {
		id, err := s.Submit(busapi.SubmissionFromWire(map[string]string{"id": fmt.Sprintf("m%d", i), "agent": "alpha", "text": fmt.Sprintf("message number %d", i)}))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	tests := []struct {
		name     string
		args     []string
		want     []string // run ids, in order
		wantMore string   // the cursor offered on stderr
	}{
		{"One_page_offers_the_next", []string{"list", "--limit", "3"}, []string{ids[6], ids[5], ids[4]}, ids[4]},
		{"Before_gives_the_next_page", []string{"list", "--limit", "3", "--before", ids[4]}, []string{ids[3], ids[2], ids[1]}, ids[1]},
		{"All_walks_every_page", []string{"list", "--limit", "3", "--all"}, []string{ids[6], ids[5], ids[4], ids[3], ids[2], ids[1], ids[0]}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out.Reset()
			errOut.Reset()
			if err := c.runs(tc.args); err != nil {
				t.Fatalf("runs %v: %v", tc.args, err)
			}
			var got []string
			for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n")[1:] {
				got = append(got, strings.Fields(line)[0])
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("listed %v, want %v", got, tc.want)
			}
			if !strings.Contains(out.String(), "message number") {
				t.Fatalf("list shows no text preview:\n%s", out)
			}
			if more := errOut.String(); (tc.wantMore == "") != (more == "") || !strings.Contains(more, tc.wantMore) {
				t.Fatalf("stderr = %q, want the cursor %q", more, tc.wantMore)
			}
		})
	}
	if err := c.runs([]string{"list", "--limit", "501"}); err == nil {
		t.Fatal("--limit 501 was accepted")
	}
}

func TestRunsShowPrintsTextsLongerThanGetRunReturns(t *testing.T) {
	t.Parallel()
	c, s, out, _ := runsSchedulerOnBus(t, t.TempDir())
	long := strings.Repeat("0123456789", 150000) + "THE END"
	id, err := s.Submit(busapi.SubmissionFromWire(map[string]string{"id": "m1", "agent": "alpha", "text": long}))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.runs([]string{"show", id}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "THE END") || !strings.Contains(out.String(), strings.Repeat("0123456789", 10)) {
		t.Fatalf("runs show printed %d bytes without the end of the %d byte message", out.Len(), len(long))
	}
}

func TestStatusShowsQuarantinedRecords(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// A scheduler.db with one undecodable summary in it.
	s, err := scheduler.New(&config.Config{}, dir, scheduler.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := bolt.Open(filepath.Join(dir, scheduler.DBName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("summaries")).Put([]byte("r1"), []byte("{not json")) })
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	c, _, out, _ := runsSchedulerOnBus(t, dir)
	if err := c.runs([]string{"list"}); err != nil { // reading it sets it aside
		t.Fatalf("runs list with an undecodable record: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		out.Reset()
		_ = c.status(nil) // intake is not running: that is not what this test is about
		if strings.Contains(out.String(), "Quarantined=1") && strings.Contains(out.String(), "1 undecodable record(s) quarantined") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("berthctl status does not show the quarantined record:\n%s", out)
}
