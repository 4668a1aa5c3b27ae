// Package layout checks the project's structure rules.
package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/triagehq/triage"

// core lists the transport-agnostic packages. They may import the standard
// library and each other, nothing else.
var core = []string{"clock", "criticality", "isolate", "attempt", "outcome", "wire", "trust", "edge", "throttle", "retry", "admission", "subset", "balance", "connload", "quota", "cost", "sim", "internal/window", "internal/reqctx", "internal/proc"}

func TestCoreImportsOnlyStdlibAndCore(t *testing.T) {
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
		if strings.HasPrefix(rel, "cmd"+string(filepath.Separator)) {
			return nil
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
