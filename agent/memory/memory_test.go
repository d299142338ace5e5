package memory

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// corpus is a small fixed set of facts an ops agent might keep.
var corpus = []string{
	"The nightly backup of the database runs at 02:00 on nas-02.",
	"Backups older than 30 days are pruned by the retention job.",
	"The web frontend is deployed with a blue-green switch on lb-01.",
	"Alice is on call for the database this week.",
	"Lunch for the team is at noon on Fridays.",
	"The staging database lives on db-stage-1 and is reset every Monday.",
	"Disk alerts fire at 85% usage on every host.",
}

func fill(t *testing.T) *Store {
	t.Helper()
	s := Open(filepath.Join(t.TempDir(), FileName))
	for i, c := range corpus {
		if _, err := s.Add(c, "test"); err != nil {
			t.Fatal(err)
		}
		_ = i
	}
	return s
}

func TestSearchRanksTheMostRelevantFactFirst(t *testing.T) {
	t.Parallel()
	s := fill(t)
	tests := []struct {
		query string
		want  string // substring of the best fact
	}{
		{"when does the backup run", "nightly backup"},
		{"who is on call", "Alice is on call"},
		{"how do we deploy the frontend", "blue-green"},
		{"staging database reset", "db-stage-1"},
		{"DISK usage ALERTS", "85%"},
		{"pruning old backups retention", "retention job"},
	}
	for _, tc := range tests {
		t.Run(strings.ReplaceAll(tc.query, " ", "_"), func(t *testing.T) {
			t.Parallel()
			res, err := s.Search(tc.query, 3)
			if err != nil {
				t.Fatal(err)
			}
			if len(res) == 0 || !strings.Contains(res[0].Content, tc.want) {
				t.Fatalf("best match for %q = %+v, want the fact with %q", tc.query, res, tc.want)
			}
			for i := 1; i < len(res); i++ {
				if res[i].Score > res[i-1].Score {
					t.Errorf("results are not sorted by score: %+v", res)
				}
			}
		})
	}
}

func TestSearchWithoutSharedWordsFindsNothing(t *testing.T) {
	t.Parallel()
	res, err := fill(t).Search("kubernetes helm chart", 5)
	if err != nil || len(res) != 0 {
		t.Errorf("results = %+v, %v; want none", res, err)
	}
}

func TestDeleteForgetsOneFactAndSurvivesReopening(t *testing.T) {
	t.Parallel()
	s := fill(t)
	res, _ := s.Search("lunch", 1)
	if len(res) != 1 {
		t.Fatal("lunch not found")
	}
	if found, err := s.Delete(res[0].ID); !found || err != nil {
		t.Fatalf("Delete = %v, %v", found, err)
	}
	if found, _ := s.Delete(res[0].ID); found {
		t.Error("a deleted fact was deleted twice")
	}
	all, err := Open(s.path).All()
	if err != nil || len(all) != len(corpus)-1 {
		t.Fatalf("after delete: %d facts, %v", len(all), err)
	}
	if res, _ := Open(s.path).Search("lunch noon", 5); len(res) != 0 {
		t.Errorf("the deleted fact is still found: %+v", res)
	}
}

func TestATornLastLineIsSkippedAndTheNextFactStillLands(t *testing.T) {
	t.Parallel()
	s := fill(t)
	f, err := os.OpenFile(s.path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"id":"mtorn","content":"half a li`)
	f.Close()
	if _, err := s.Add("printer is on floor 3", ""); err != nil {
		t.Fatal(err)
	}
	all, _ := s.All()
	if len(all) != len(corpus)+1 || all[len(all)-1].Content != "printer is on floor 3" {
		t.Errorf("facts after a torn line: %d, last %+v", len(all), all[len(all)-1])
	}
}

func TestAddRefusesEmptyAndOversizedFacts(t *testing.T) {
	t.Parallel()
	s := Open(filepath.Join(t.TempDir(), FileName))
	s.now = func() time.Time { return time.Unix(0, 0) }
	for _, c := range []string{"  ", strings.Repeat("x", MaxContent+1)} {
		if _, err := s.Add(c, ""); err == nil {
			t.Errorf("Add(%d bytes) succeeded", len(c))
		}
	}
}

func TestAFactWithAHugeSourceHidesNoLaterFactAndDeleteKeepsThem(t *testing.T) {
	t.Parallel()
	s := Open(filepath.Join(t.TempDir(), FileName))
	first, err := s.Add("alpha fact", "test")
	if err != nil {
		t.Fatal(err)
	}
	// JSON escapes "<" as 6 bytes: this line is far longer than any scanner buffer.
	if _, err := s.Add("page fact", strings.Repeat("<", 200_000)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add("beta fact", "test"); err != nil {
		t.Fatal(err)
	}
	if found, err := s.Delete(first.ID); err != nil || !found {
		t.Fatalf("Delete: %v %v", found, err)
	}
	all, err := s.All()
	if err != nil {
		t.Fatal(err)
	}
	var contents []string
	for _, f := range all {
		contents = append(contents, f.Content)
	}
	if strings.Join(contents, ",") != "page fact,beta fact" {
		t.Fatalf("after deleting alpha the store holds %q, want page and beta", contents)
	}
}
