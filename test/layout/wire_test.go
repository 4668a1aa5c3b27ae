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

	"github.com/triagehq/triage/wire"
)

// TestWireSpelledOnce: no Go file of the module but package wire's spells
// a key of triage's wire (any letter case: a metadata key or a header
// name) as a string literal; they use wire's constants, so that a key is
// renamed or bounded in one place. Tests may spell them, as a caller on
// the wire would, and so may the conformance table's rows
// (internal/testkit/conformance), which are the tests' callers.
func TestWireSpelledOnce(t *testing.T) {
	keys := map[string]bool{strings.ToLower(wire.ForwardedClientCertKey): true}
	for _, k := range wire.Keys() {
		keys[k.Name] = true
	}
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (name == "testdata" || name == "bench" || name == "wire" || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") ||
			filepath.ToSlash(path) == "../../internal/testkit/conformance/conformance.go" {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			if s, err := strconv.Unquote(lit.Value); err == nil && keys[strings.ToLower(s)] {
				t.Errorf("%s: %q spelled outside package wire: use its constant", fset.Position(lit.Pos()), s)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
