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
// name), or any name starting with triage- or x-triage-claimed- save those
// notWire lists, as a string literal; they use wire's constants, so that a
// key is added, renamed or bounded in one place. Tests may spell them, as a caller on
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
			rel := strings.TrimPrefix(filepath.ToSlash(path), "../../")
			if s, err := strconv.Unquote(lit.Value); err == nil && (keys[strings.ToLower(s)] || wireLike(s) && notWire[rel+": "+s] == "") {
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

// notWire are the literals starting with wire.Prefix that name no key on
// the wire, each with what it names.
var notWire = map[string]string{
	"cmd/triage/app/proxy.go: triage-proxy":                   "the proxy's gRPC resolver scheme",
	"cmd/triage/internal/drill/drill.go: triage-drill-":       "a temporary directory's pattern",
	"cmd/triage/internal/drill/partition.go: triage-drill-%d": "a network namespace's name",
	"cmd/triage/internal/drill/stack.go: triage-stack-":       "a temporary directory's pattern",
	"triageotel/cmd/triage/otlp.go: triage-":                  "OpenTelemetry's service.name, triage-<command>",
}

// wireLike reports whether s reads as a name on triage's wire: it starts
// with wire.Prefix or wire.ClaimPrefix (any case, '_' for '-'), whether
// or not wire registers it, so that a key is added in wire and nowhere
// else.
func wireLike(s string) bool {
	l := strings.ToLower(s)
	return strings.HasPrefix(l, wire.Prefix) || strings.HasPrefix(l, wire.ClaimPrefix)
}
