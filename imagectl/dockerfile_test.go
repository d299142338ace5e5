package imagectl_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/imagectl"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const baseID = "sha256:b8a742ee396756d88c284be2121df6cd7d48723a088a2a9e9735852e74d6280f"

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("cannot read golden file (go test ./imagectl -run %s -update writes it): %v", t.Name(), err)
	}
	if got != string(want) {
		t.Fatalf("Dockerfile differs from %s:\n--- got\n%s--- want\n%s", path, got, want)
	}
}

func TestDockerfilesMatchTheirGoldenFiles(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		df   string
	}{
		{"sandbox_host_debs", imagectl.SandboxImage{BaseRef: "berth-base:bookworm", BaseID: baseID,
			Packages: []string{"python3", "jq", "git", "jq"}, Env: map[string]string{"LANG": "C.UTF-8", "GREETING": `say "hi" $HOME \ ok`}}.Dockerfile()},
		{"sandbox_build_network", imagectl.SandboxImage{BaseRef: "debian:bookworm", BaseID: baseID,
			Packages: []string{"jq"}, Source: imagectl.BuildNetwork}.Dockerfile()},
		{"sandbox_env_only", imagectl.SandboxImage{BaseRef: "berth-base:bookworm", BaseID: baseID, Env: map[string]string{"TZ": "UTC"}}.Dockerfile()},
		{"isolated", imagectl.IsolatedImage{From: "berth-sandbox:0123456789abcdef", BaseRef: "berth-sandbox:0123456789abcdef (image_config on berth-base:bookworm)"}.Dockerfile()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			golden(t, tc.name, tc.df)
		})
	}
}

func TestSandboxHash(t *testing.T) {
	t.Parallel()
	base := imagectl.SandboxImage{BaseRef: "berth-base:bookworm", BaseID: baseID, Packages: []string{"jq", "git"}, Env: map[string]string{"A": "1", "B": "2"}}
	same := func(s imagectl.SandboxImage) imagectl.SandboxImage { return s }
	tests := []struct {
		name   string
		change func(imagectl.SandboxImage) imagectl.SandboxImage
		equal  bool
	}{
		{"Same_inputs_give_the_same_tag", same, true},
		{"Package_order_and_duplicates_do_not_matter", func(s imagectl.SandboxImage) imagectl.SandboxImage {
			s.Packages = []string{"git", "jq", "git"}
			return s
		}, true},
		{"The_base_name_does_not_matter_only_its_id", func(s imagectl.SandboxImage) imagectl.SandboxImage {
			s.BaseRef = "my-base:1"
			return s
		}, true},
		{"A_new_package_is_a_new_tag", func(s imagectl.SandboxImage) imagectl.SandboxImage {
			s.Packages = []string{"jq", "git", "curl"}
			return s
		}, false},
		{"A_rebuilt_base_under_the_same_name_is_a_new_tag", func(s imagectl.SandboxImage) imagectl.SandboxImage {
			s.BaseID = "sha256:" + strings.Repeat("0", 64)
			return s
		}, false},
		{"A_changed_env_value_is_a_new_tag", func(s imagectl.SandboxImage) imagectl.SandboxImage {
			s.Env = map[string]string{"A": "1", "B": "3"}
			return s
		}, false},
		{"Moving_a_value_between_env_names_is_a_new_tag", func(s imagectl.SandboxImage) imagectl.SandboxImage {
			s.Env = map[string]string{"A": "12", "B": ""}
			return s
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			changed := tc.change(base)
			changed.Env = cloneEnv(changed.Env)
			if got := changed.Tag() == base.Tag(); got != tc.equal {
				t.Fatalf("tags %s and %s: equal = %v, want %v", base.Tag(), changed.Tag(), got, tc.equal)
			}
			if !strings.HasPrefix(base.Tag(), imagectl.SandboxRepository+":") || len(base.Tag()) != len(imagectl.SandboxRepository)+1+16 {
				t.Fatalf("tag %q is not berth-sandbox:<16 hex digits>", base.Tag())
			}
		})
	}
}

func cloneEnv(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func TestIsolatedTagHoldsTheVersionAndOnlyTagCharacters(t *testing.T) {
	t.Parallel()
	hash := strings.Repeat("ab", 32)
	tests := []struct{ version, want string }{
		{"v1.2.3", "berth-isolated:1.2.3-abababababababab"},
		{"1.2.3+4.gabc", "berth-isolated:1.2.3_4.gabc-abababababababab"},
		{"0.0.0~installtest", "berth-isolated:0.0.0_installtest-abababababababab"},
	}
	for _, tc := range tests {
		if got := imagectl.IsolatedTag(tc.version, hash); got != tc.want {
			t.Errorf("IsolatedTag(%q) = %q, want %q", tc.version, got, tc.want)
		}
	}
}

func TestStepsCountsInstructionsNotContinuationsOrComments(t *testing.T) {
	t.Parallel()
	df := imagectl.SandboxImage{BaseRef: "b", BaseID: baseID, Packages: []string{"jq"}, Env: map[string]string{"A": "1"}}.Dockerfile()
	if got := imagectl.Steps(df); got != 4 { // FROM, ENV, COPY, RUN
		t.Fatalf("Steps = %d, want 4 for:\n%s", got, df)
	}
}
