package testenv_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// scripts/test.sh installs, before any test runs, every program berth and its
// tests run by name, and everything the scripts it runs after `go test`
// install themselves: a tool that arrives halfway fails the tests before it
// on a fresh machine (rpm did, installed by scripts/install-test.sh). What
// this cannot see (a program a sandboxed shell command runs) is what
// scripts/fresh-machine-check.sh proves on a fresh Debian 12.
func TestTheTestCommandInstallsEveryToolBeforeTheTestsRun(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..", "..")
	needs := testCommandNeeds(t, root)

	t.Run("Every_program_run_by_name_in_the_Go_code", func(t *testing.T) {
		t.Parallel()
		// The toolchain is the test command's precondition, and the rest
		// come with a debootstrap minbase (Debian's Essential set and apt).
		preinstalled := map[string]bool{"go": true, "gofmt": true, "ls": true, "apt-get": true}
		for program, where := range programsRunByName(t, root) {
			if preinstalled[program] || strings.HasPrefix(program, "/") {
				continue
			}
			if !needs.provides(program) {
				t.Errorf("%s runs %s, which scripts/test.sh does not install: add %s:PACKAGE to its test_needs", where, program, program)
			}
		}
	})

	t.Run("Everything_the_scripts_run_after_the_tests_install", func(t *testing.T) {
		t.Parallel()
		for _, script := range scriptsRunBy(t, filepath.Join(root, "scripts", "test.sh")) {
			for _, pair := range ensuredIn(t, root, script) {
				if need, _, _ := strings.Cut(pair, ":"); !needs.has[need] {
					t.Errorf("%s installs %s, which scripts/test.sh does not install before the tests: add it to test_needs", script, pair)
				}
			}
		}
	})
}

// needSet is scripts/test.sh's test_needs, NEED:PACKAGE as ensure_packages takes them.
type needSet struct{ has map[string]bool }

// provides says whether a NEED is the program, by name or as a path to it.
func (n needSet) provides(program string) bool {
	for need := range n.has {
		if need == program || strings.HasPrefix(need, "/") && filepath.Base(need) == program {
			return true
		}
	}
	return false
}

func testCommandNeeds(t *testing.T, root string) needSet {
	t.Helper()
	dockerNeeds := shellArray(t, filepath.Join(root, "scripts", "lib.sh"), "docker_needs")
	n := needSet{has: map[string]bool{}}
	for _, pair := range shellArray(t, filepath.Join(root, "scripts", "test.sh"), "test_needs") {
		if pair == `"${docker_needs[@]}"` {
			for _, p := range dockerNeeds {
				need, _, _ := strings.Cut(p, ":")
				n.has[need] = true
			}
			continue
		}
		need, _, ok := strings.Cut(pair, ":")
		if !ok {
			t.Fatalf("scripts/test.sh: %q in test_needs is not NEED:PACKAGE", pair)
		}
		n.has[need] = true
	}
	if len(n.has) == 0 {
		t.Fatal("scripts/test.sh has no test_needs")
	}
	return n
}

// shellArray reads `name=( … )` from a bash script: its words, without
// comments; the array may span lines.
func shellArray(t *testing.T, path, name string) []string {
	t.Helper()
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(text), "\n"+name+"=(")
	if !ok {
		t.Fatalf("%s has no array %s", path, name)
	}
	var words []string
	for _, line := range strings.Split(rest, "\n") {
		line, _, _ = strings.Cut(line, " #")
		body, closed := strings.CutSuffix(strings.TrimSpace(line), ")")
		words = append(words, strings.Fields(body)...)
		if closed {
			return words
		}
	}
	t.Fatalf("%s: array %s does not end", path, name)
	return nil
}

// scriptsRunBy lists the scripts/*.sh that a script runs.
func scriptsRunBy(t *testing.T, path string) []string {
	t.Helper()
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var scripts []string
	seen := map[string]bool{}
	for _, line := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, s := range regexp.MustCompile(`scripts/[a-z-]+\.sh`).FindAllString(line, -1) {
			if s != "scripts/lib.sh" && !strings.HasSuffix(path, s) && !seen[s] {
				seen[s] = true
				scripts = append(scripts, s)
			}
		}
	}
	if len(scripts) == 0 {
		t.Fatalf("%s runs no scripts/*.sh", path)
	}
	return scripts
}

// ensuredIn lists the NEED:PACKAGE pairs a script hands ensure_packages
// (and ensure_docker's).
func ensuredIn(t *testing.T, root, script string) []string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(root, script))
	if err != nil {
		t.Fatal(err)
	}
	var pairs []string
	for _, line := range strings.Split(string(text), "\n") {
		line, _, _ = strings.Cut(line, "#")
		for _, cmd := range strings.FieldsFunc(line, func(r rune) bool { return r == ';' || r == '&' || r == '|' }) {
			words := strings.Fields(cmd)
			if len(words) == 0 {
				continue
			}
			switch words[0] {
			case "ensure_docker":
				pairs = append(pairs, shellArray(t, filepath.Join(root, "scripts", "lib.sh"), "docker_needs")...)
			case "ensure_packages":
				pairs = append(pairs, words[1:]...)
			}
		}
	}
	return pairs
}

// programsRunByName maps each program that Go code in the repository looks
// up or runs by a literal name (exec.LookPath, exec.Command,
// exec.CommandContext) to one place that does.
func programsRunByName(t *testing.T, root string) map[string]string {
	t.Helper()
	programs := map[string]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		execName := ""
		for _, imp := range f.Imports {
			if imp.Path.Value == `"os/exec"` {
				execName = "exec"
				if imp.Name != nil {
					execName = imp.Name.Name
				}
			}
		}
		if execName == "" {
			return nil
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != execName {
				return true
			}
			arg := 0
			switch sel.Sel.Name {
			case "LookPath", "Command":
			case "CommandContext":
				arg = 1
			default:
				return true
			}
			if len(call.Args) <= arg {
				return true
			}
			if lit, ok := call.Args[arg].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if name, err := strconv.Unquote(lit.Value); err == nil {
					rel, _ := filepath.Rel(root, fset.Position(lit.Pos()).Filename)
					programs[name] = rel
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatalf("cannot read the repository's Go files: %v", err)
	}
	return programs
}
