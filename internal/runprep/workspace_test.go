package runprep

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/internal/config"
)

func TestPrepareWorkspaceSetsTheModesBackWhateverTheyBecame(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		wsMode    os.FileMode
		agentsDir os.FileMode
	}{
		{"A_workspace_opened_to_everyone_is_closed_again", 0o777, 0o755},
		{"A_workspace_with_a_set_group_id_bit_loses_it", 0o700 | os.ModeSetgid, 0o755},
		{"An_agents_directory_closed_by_hand_is_opened_again", 0o700, 0o700},
		{"An_agents_directory_with_the_sticky_bit_loses_it", 0o700, 0o755 | os.ModeSticky},
		{"Modes_as_they_should_be_stay", 0o700, 0o755},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := New(Options{StateDir: t.TempDir(), Logger: quietLog})
			a := config.Agent{ID: "alpha"}
			ws, err := p.prepareWorkspace(a, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(ws, tc.wsMode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Dir(ws), tc.agentsDir); err != nil {
				t.Fatal(err)
			}
			if _, err := p.prepareWorkspace(a, nil); err != nil {
				t.Fatal(err)
			}
			for dir, want := range map[string]uint32{ws: 0o700, filepath.Dir(ws): 0o755} {
				var st syscall.Stat_t
				if err := syscall.Stat(dir, &st); err != nil {
					t.Fatal(err)
				}
				if got := st.Mode & 0o7777; got != want {
					t.Errorf("%s has mode %04o after the next run's preparation; want %04o", dir, got, want)
				}
			}
		})
	}
}
