package isolation_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/isolation"
)

// stateTree builds a berth state dir: databases, and the workspaces of agents
// a and b under agents/.
func stateTree(t *testing.T) (state, config, wsA, wsB string) {
	t.Helper()
	root := t.TempDir()
	state = filepath.Join(root, "var", "lib", "berth")
	config = filepath.Join(root, "etc", "berth")
	wsA = filepath.Join(state, "agents", "a")
	wsB = filepath.Join(state, "agents", "b")
	for _, d := range []string{wsA, wsB, config, filepath.Join(state, "cache")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(state, "scheduler.db"), filepath.Join(config, "berth.toml")} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return state, config, wsA, wsB
}

// covers reports whether any of paths is p or an ancestor of p.
func covers(paths []string, p string) bool {
	for _, q := range paths {
		if q == p || q == "/" || strings.HasPrefix(p, q+"/") {
			return true
		}
	}
	return false
}

func TestHostPolicyKeepsTheWorkspaceAndDeniesTheRestOfTheStateDir(t *testing.T) {
	t.Parallel()
	state, cfg, wsA, wsB := stateTree(t)
	p := isolation.HostPolicy(isolation.FileAccess{}, wsA, []string{cfg, state, filepath.Join(state, "agents")})

	if !slices.Contains(p.AllowReadWrite, wsA) {
		t.Errorf("workspace %s is not read-write: %q", wsA, p.AllowReadWrite)
	}
	for _, d := range p.Deny {
		if d == wsA || strings.HasPrefix(wsA, d+"/") {
			t.Errorf("deny %s covers the agent's own workspace", d)
		}
	}
	for _, want := range []string{cfg, wsB, filepath.Join(state, "scheduler.db"), filepath.Join(state, "cache")} {
		if !slices.Contains(p.Deny, want) {
			t.Errorf("%s is not denied: %q", want, p.Deny)
		}
	}
	if p.Unrestricted || p.Network || len(p.ConnectPorts) != 0 {
		t.Errorf("got %+v, want confined, no network, no ports", p)
	}
}

func TestHostPolicyNeverExposesTheShadowFile(t *testing.T) {
	t.Parallel()
	_, _, wsA, _ := stateTree(t)
	p := isolation.HostPolicy(isolation.FileAccess{AllowHomeDotfiles: true}, wsA, nil, isolation.RunUserHome("/root"))
	for _, list := range [][]string{p.AllowRead, p.AllowReadWrite} {
		if covers(list, "/etc/shadow") || covers(list, "/etc/berth/berth.toml") {
			t.Errorf("policy lets the agent read /etc/shadow or berth's config: %q", list)
		}
	}
	if !covers(p.AllowRead, "/usr/bin/env") || !covers(p.AllowRead, "/etc/passwd") {
		t.Errorf("system set misses /usr or /etc/passwd: %q", p.AllowRead)
	}
	if _, err := os.Stat("/bin/sh"); err == nil && !covers(p.AllowRead, "/bin/sh") {
		t.Errorf("system set misses /bin/sh: %q", p.AllowRead)
	}
	if !slices.Contains(p.AllowReadWrite, "/dev/null") {
		t.Errorf("/dev/null is not read-write: %q", p.AllowReadWrite)
	}
	for _, path := range append(slices.Clone(p.AllowRead), p.AllowReadWrite...) {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("policy holds missing system path %s", path)
		}
	}
}

func TestHostPolicyAddsTheAgentsFileAccess(t *testing.T) {
	t.Parallel()
	_, _, wsA, _ := stateTree(t)
	a := isolation.FileAccess{
		AllowRead:      []string{"/srv/docs/"},
		AllowReadWrite: []string{"/srv/shared"},
		Deny:           []string{"/srv/docs/private", wsA, filepath.Join(wsA, "secret")},
		AllowNetwork:   true,
	}
	p := isolation.HostPolicy(a, wsA, nil)
	if !slices.Contains(p.AllowRead, "/srv/docs") || !slices.Contains(p.AllowReadWrite, "/srv/shared") {
		t.Errorf("configured paths missing: read %q, read-write %q", p.AllowRead, p.AllowReadWrite)
	}
	want := []string{"/srv/docs/private", filepath.Join(wsA, "secret")}
	if !slices.Equal(p.Deny, want) {
		t.Errorf("deny is %q, want %q (a deny of the workspace itself is dropped)", p.Deny, want)
	}
	if !p.Network {
		t.Error("allow_network did not allow the network")
	}
}

func TestHostPolicyGrantsHomeDotfilesOnlyWhenAllowed(t *testing.T) {
	t.Parallel()
	_, _, wsA, _ := stateTree(t)
	home := t.TempDir()
	for _, f := range []string{".gitconfig", "notes.txt"} {
		if err := os.WriteFile(filepath.Join(home, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(home, ".config"), 0o755); err != nil {
		t.Fatal(err)
	}
	allowed := isolation.HostPolicy(isolation.FileAccess{AllowHomeDotfiles: true}, wsA, nil, isolation.RunUserHome(home))
	for _, want := range []string{filepath.Join(home, ".gitconfig"), filepath.Join(home, ".config")} {
		if !slices.Contains(allowed.AllowRead, want) {
			t.Errorf("%s is not readable: %q", want, allowed.AllowRead)
		}
	}
	if covers(allowed.AllowRead, filepath.Join(home, "notes.txt")) {
		t.Errorf("a non-dot file of home is readable: %q", allowed.AllowRead)
	}
	denied := isolation.HostPolicy(isolation.FileAccess{}, wsA, nil, isolation.RunUserHome(home))
	if covers(denied.AllowRead, filepath.Join(home, ".gitconfig")) {
		t.Errorf("dotfiles readable without allow_home_dotfiles: %q", denied.AllowRead)
	}
}

func TestHostPolicyIsOnlyUnrestrictedWhenConfiguredSo(t *testing.T) {
	t.Parallel()
	_, _, wsA, _ := stateTree(t)
	p := isolation.HostPolicy(isolation.FileAccess{Unrestricted: true}, wsA, []string{"/etc/berth"})
	if want := (agentproto.Policy{Unrestricted: true}); !equalPolicy(p, want) {
		t.Errorf("got %+v, want %+v", p, want)
	}
}

func equalPolicy(a, b agentproto.Policy) bool {
	return a.Unrestricted == b.Unrestricted && a.Network == b.Network &&
		slices.Equal(a.AllowRead, b.AllowRead) && slices.Equal(a.AllowReadWrite, b.AllowReadWrite) &&
		slices.Equal(a.Deny, b.Deny) && slices.Equal(a.ConnectPorts, b.ConnectPorts)
}

func TestHostPolicyKeepsAWorkspaceReachedThroughASymlink(t *testing.T) {
	t.Parallel()
	state, _, wsA, wsB := stateTree(t)
	link := filepath.Join(t.TempDir(), "ws")
	if err := os.Symlink(wsA, link); err != nil {
		t.Fatal(err)
	}
	p := isolation.HostPolicy(isolation.FileAccess{}, link, []string{state})
	real, _ := filepath.EvalSymlinks(wsA)
	for _, d := range p.Deny {
		if d == real || strings.HasPrefix(real, d+"/") {
			t.Errorf("deny %s covers the workspace behind the symlink", d)
		}
	}
	realB, _ := filepath.EvalSymlinks(wsB)
	if !slices.Contains(p.Deny, realB) {
		t.Errorf("the other workspace %s is not denied: %q", realB, p.Deny)
	}
}

// denyAsEvalSymlinksJudges is the deny list HostPolicy must make: each
// path resolved with filepath.EvalSymlinks (or taken as written when it
// does not resolve) to judge whether it holds the workspace.
func denyAsEvalSymlinksJudges(deny []string, workspace string) []string {
	real := func(p string) string {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return r
		}
		return filepath.Clean(p)
	}
	keep := real(filepath.Clean(workspace))
	seen := map[string]bool{}
	var out []string
	add := func(p string) {
		if p = filepath.Clean(p); !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, d := range deny {
		if d == "" {
			continue
		}
		d = filepath.Clean(d)
		r := real(d)
		if r == keep {
			continue
		}
		rel, err := filepath.Rel(r, keep)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			add(d)
			continue
		}
		dir := r
		for _, next := range strings.Split(rel, "/") {
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if e.Name() != next {
					add(filepath.Join(dir, e.Name()))
				}
			}
			dir = filepath.Join(dir, next)
		}
	}
	return out
}

func TestHostPolicyJudgesDenyPathsThroughSymlinksAsEvalSymlinksDoes(t *testing.T) {
	t.Parallel()
	state, _, wsA, _ := stateTree(t)
	root := filepath.Dir(filepath.Dir(filepath.Dir(state)))
	links := map[string]string{
		filepath.Join(state, "to-agents"): "agents",                    // relative
		filepath.Join(state, "up"):        "../berth",                  // relative, through ..
		filepath.Join(root, "hop1"):       filepath.Join(root, "hop2"), // a chain
		filepath.Join(root, "hop2"):       filepath.Join(state, "agents"),
		filepath.Join(state, "to-a"):      "agents/a",
		// .. applies after to-a is followed: state/agents, not state's parent.
		filepath.Join(state, "back"): "to-a/..",
		filepath.Join(root, "ws"):    wsA,
		filepath.Join(root, "gone"):  filepath.Join(root, "nothing"),
		filepath.Join(root, "loop1"): "loop2",
		filepath.Join(root, "loop2"): "loop1",
	}
	for link, target := range links {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	deny := []string{
		state, filepath.Join(state, "agents"), filepath.Join(state, "agents", "b"), filepath.Join(state, "to-agents"),
		filepath.Join(state, "up"), filepath.Join(root, "hop1"), filepath.Join(state, "back"), filepath.Join(state, "back", "b"),
		filepath.Join(root, "gone"), filepath.Join(root, "loop1"), filepath.Join(state, "scheduler.db", "x"),
		filepath.Join(state, "to-a", ".."), "relative/path", "",
	}
	for _, ws := range []string{wsA, filepath.Join(root, "ws"), filepath.Join(state, "to-agents", "a"), filepath.Join(state, "back", "a")} {
		t.Run(strings.ReplaceAll(strings.TrimPrefix(ws, root+"/"), "/", "_"), func(t *testing.T) {
			t.Parallel()
			got := isolation.HostPolicy(isolation.FileAccess{Deny: deny}, ws, nil).Deny
			if want := denyAsEvalSymlinksJudges(deny, ws); !slices.Equal(got, want) {
				t.Errorf("deny for workspace %s\n got %q\nwant %q", ws, got, want)
			}
			for _, d := range got {
				if real, _ := filepath.EvalSymlinks(wsA); d == real || strings.HasPrefix(real, d+"/") {
					t.Errorf("deny %s covers the workspace", d)
				}
			}
		})
	}
}

func TestHostPolicyJudgesEachRunOnTheTreeAsItIsThen(t *testing.T) {
	t.Parallel()
	state, _, wsA, wsB := stateTree(t)
	shared := filepath.Join(filepath.Dir(state), "shared")
	if err := os.Mkdir(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	fa := isolation.FileAccess{Deny: []string{shared}}
	if p := isolation.HostPolicy(fa, wsA, nil); !slices.Equal(p.Deny, []string{shared}) {
		t.Fatalf("deny = %q; want %s", p.Deny, shared)
	}
	// shared becomes a link to the agents' directory: denying it whole now
	// would take the workspace away; what it leads to besides is denied.
	if err := os.Remove(shared); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(state, "agents"), shared); err != nil {
		t.Fatal(err)
	}
	p := isolation.HostPolicy(fa, wsA, nil)
	if slices.Contains(p.Deny, shared) || !slices.Contains(p.Deny, wsB) {
		t.Fatalf("deny = %q after %s became a link to %s; want %s denied and the link not", p.Deny, shared, filepath.Dir(wsA), wsB)
	}
}
