// Package layout checks the project's structure rules.
package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/triagehq/triage"

// notCore names the packages that are not transport-agnostic core, by
// kind: adapters (every package whose path starts with "triage"), the
// CLI (under cmd/), the tests (under test/) and the test and demo
// helpers (under internal/testkit/). Every other package of the module
// is core, found by walking the tree, so a new package is checked unless
// it says what else it is here.
func notCore(rel string) bool {
	for _, floor := range []string{"cmd", "test", "internal/testkit"} {
		if rel == floor || strings.HasPrefix(rel, floor+"/") {
			return true
		}
	}
	return strings.HasPrefix(rel, "triage") || rel == "deploy" || strings.HasPrefix(rel, "deploy/") // deploy: operator files and their checks
}

// corePackages walks the module (not bench/, its own module) and returns
// the directories of its core packages, relative to the root.
func corePackages(t *testing.T) []string {
	t.Helper()
	root := filepath.Join("..", "..")
	var core []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (name == "testdata" || name == "bench" || strings.HasPrefix(name, ".")) {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if rel == "." || notCore(rel) {
			return nil
		}
		if files, _ := filepath.Glob(filepath.Join(path, "*.go")); len(files) > 0 {
			core = append(core, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return core
}

// The module's packages (every one `go test ./...` builds, tests
// included) import nothing of OpenTelemetry or Kubernetes: those live in
// modules of their own (triageotel, deploy/kubernetes/check), so that a
// user of the library never downloads them.
func TestNoOpenTelemetryOrKubernetesInTheModule(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "-test", "./...")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := strings.Fields(string(out))
	if !slices.Contains(pkgs, module+"/intake") {
		t.Fatalf("go list -deps lists no %s/intake: the listing is broken", module)
	}
	for _, p := range pkgs {
		for _, heavy := range []string{"go.opentelemetry.io/", "k8s.io/", "sigs.k8s.io/"} {
			if strings.HasPrefix(p, heavy) {
				t.Errorf("%s is in the module's build: OpenTelemetry and Kubernetes belong to modules of their own", p)
			}
		}
	}
}

func TestCoreImportsOnlyStdlibAndCore(t *testing.T) {
	core := corePackages(t)
	for _, want := range []string{"admission", "intake", "lifecycle", "internal/reqctx"} {
		if !slices.Contains(core, want) {
			t.Fatalf("core packages %v lack %s: the walk is broken", core, want)
		}
	}
	allowed := map[string]bool{}
	for _, c := range core {
		allowed[module+"/"+c] = true
	}
	for _, c := range core {
		dir := filepath.Join("..", "..", c)
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("core package %s: no Go files (%v)", c, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				first, _, _ := strings.Cut(p, "/")
				if !strings.Contains(first, ".") {
					continue // standard library
				}
				if !allowed[p] {
					t.Errorf("%s imports %s: core packages import only the standard library and other core packages", f, p)
				}
			}
		}
	}
}

// No package outside cmd/ touches flags, signals or the process
// environment, and no package has an init function.
func TestNoProcessStateOutsideCmd(t *testing.T) {
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == "bench" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		af, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range af.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && fn.Name.Name == "init" {
				t.Errorf("%s has an init function", rel)
			}
		}
		if slashed := filepath.ToSlash(rel); strings.HasPrefix(slashed, "cmd/") || strings.Contains(slashed, "/cmd/") {
			return nil // a command (the module's, or a nested module's)
		}
		for _, imp := range af.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if p == "flag" || p == "os/signal" {
				t.Errorf("%s imports %s outside cmd/", rel, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// maxFuncLines bounds a function outside tests and the simulator's
// scenarios (sim/), so that a reader can hold it in their head.
const maxFuncLines = 80

func TestFunctionsFitOnAScreen(t *testing.T) {
	goFiles(t, func(rel, name string) bool { return name == "bench" || rel == "sim" }, func(path, rel string) error {
		if strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		af, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range af.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > maxFuncLines {
				t.Errorf("%s: %s is %d lines, more than %d", rel, fn.Name.Name, n, maxFuncLines)
			}
		}
		return nil
	})
}

// goFiles calls f with each Go file of the repository, its path and its
// path from the root (slash-separated), leaving out testdata, hidden
// directories and the directories skip names.
func goFiles(t *testing.T, skip func(rel, name string) bool, f func(path, rel string) error) {
	t.Helper()
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() && path != root && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") || skip(rel, d.Name())) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		return f(path, rel)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// maxFileLines bounds a Go file, tests and the benchmark module's
// included, outside the simulator's scenarios (sim/) and generated code:
// a file is one part of its package that a reader can take in (issue 58).
const maxFileLines = 600

func TestFilesFitAReader(t *testing.T) {
	goFiles(t, func(rel, _ string) bool { return rel == "sim" }, func(path, rel string) error {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if ast.IsGenerated(mustParseComments(t, path, b)) {
			return nil
		}
		if n := strings.Count(string(b), "\n"); n > maxFileLines {
			t.Errorf("%s is %d lines, more than %d: split it by what its parts do", rel, n, maxFileLines)
		}
		return nil
	})
}

// mustParseComments parses a Go file's package clause and comments.
func mustParseComments(t *testing.T, path string, src []byte) *ast.File {
	t.Helper()
	af, err := parser.ParseFile(token.NewFileSet(), path, src, parser.PackageClauseOnly|parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	return af
}

// internal/ holds one kind of thing: the runtime helpers the core stands
// on, which import only the standard library, so that no import runs back
// up through it. Test and demo helpers live in internal/testkit/, and
// only tests, examples and cmd/ import them.
func TestInternalIsTheFloor(t *testing.T) {
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() && path != root && (d.Name() == "testdata" || d.Name() == "bench" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		test := strings.HasSuffix(path, "_test.go")
		dir := filepath.ToSlash(filepath.Dir(rel))
		runtime := strings.HasPrefix(dir, "internal/") && !strings.HasPrefix(dir, "internal/testkit")
		tooling := strings.HasPrefix(dir, "cmd/") || dir == "cmd" || strings.HasPrefix(dir, "test/") || strings.HasPrefix(dir, "internal/testkit/")
		af, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range af.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			first, _, _ := strings.Cut(p, "/")
			switch {
			case runtime && !test && strings.Contains(first, "."):
				t.Errorf("%s imports %s: internal/ holds runtime helpers, which import only the standard library", rel, p)
			case !test && !tooling && strings.HasPrefix(p, module+"/internal/testkit/"):
				t.Errorf("%s imports %s: test and demo helpers are for tests, examples and cmd/ only", rel, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
