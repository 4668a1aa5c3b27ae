package layout

import (
	"cmp"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// maxExported bounds a package's exported funcs, methods and types, so
// that a reader can take in its API (x/time/rate has about 24).
const maxExported = 50

// No package's API grows past maxExported (issue 58).
func TestExportedSurface(t *testing.T) {
	root := filepath.Join("..", "..")
	counts := map[string]int{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != root {
				return filepath.SkipDir // another module's
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		counts[filepath.ToSlash(filepath.Dir(rel))] += exported(f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	pkgs := slices.SortedFunc(maps.Keys(counts), func(a, b string) int { return cmp.Or(counts[b]-counts[a], strings.Compare(a, b)) })
	for _, pkg := range pkgs {
		if n := counts[pkg]; n > maxExported {
			t.Errorf("%s exports %d funcs, methods and types, more than %d", pkg, n, maxExported)
		}
	}
	for _, pkg := range pkgs[:min(len(pkgs), 10)] {
		t.Logf("%3d %s", counts[pkg], pkg) // the largest, for -v
	}
}

// exported counts f's exported funcs, methods and types.
func exported(f *ast.File) int {
	n := 0
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Name.IsExported() {
				n++
			}
		case *ast.GenDecl:
			if d.Tok != token.TYPE {
				continue
			}
			for _, s := range d.Specs {
				if s.(*ast.TypeSpec).Name.IsExported() {
					n++
				}
			}
		}
	}
	return n
}
