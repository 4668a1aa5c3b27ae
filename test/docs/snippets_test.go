// Package docs checks that the documentation's Go code builds.
package docs

import (
	"bufio"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/triagehq/triage"

// fragmentParams are the names a fragment (a ```go block that does not
// start with "package") may use without declaring them: it is built as
// the body of a function taking them, so that a README section can show
// the lines that matter and not the listener or the registry around them.
const fragmentParams = `ctx context.Context, lis net.Listener, mux *http.ServeMux, ` +
	`reg *prometheus.Registry, creds grpc.DialOption, target string`

// imports maps the package names a block may use to their paths: the
// module's own packages (added from the tree) and these.
var imports = map[string]string{
	"context": "context", "errors": "errors", "fmt": "fmt", "log": "log",
	"slog": "log/slog", "net": "net", "http": "net/http", "os": "os",
	"signal": "os/signal", "syscall": "syscall", "time": "time",
	"grpc":        "google.golang.org/grpc",
	"codes":       "google.golang.org/grpc/codes",
	"status":      "google.golang.org/grpc/status",
	"credentials": "google.golang.org/grpc/credentials",
	"insecure":    "google.golang.org/grpc/credentials/insecure",
	"health":      "google.golang.org/grpc/health",
	"healthpb":    "google.golang.org/grpc/health/grpc_health_v1",
	"prometheus":  "github.com/prometheus/client_golang/prometheus",
	"promhttp":    "github.com/prometheus/client_golang/prometheus/promhttp",
}

// block is one ```go block of a Markdown file.
type block struct {
	file string // relative to the module's root
	line int    // of the block's first line of code
	code string
}

// TestSnippetsCompile builds every ```go block of README.md and docs/*.md
// against this module, so that the documentation cannot show code that
// does not build. A block that starts with "package" is a file of its
// own; any other block is a function body (see fragmentParams), its
// imports found from the package names it uses. Errors point at the
// Markdown file's lines.
func TestSnippetsCompile(t *testing.T) {
	root := filepath.Join("..", "..")
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	mdFiles, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	mdFiles = append([]string{filepath.Join(root, "README.md")}, mdFiles...)
	var blocks []block
	for _, f := range mdFiles {
		blocks = append(blocks, goBlocks(t, root, f)...)
	}
	if len(blocks) == 0 {
		t.Fatal("no ```go block found in README.md or docs/")
	}
	addModulePackages(t, abs)

	dir := t.TempDir()
	overlay := map[string]map[string]string{"Replace": {}}
	var pkgs []string
	for i, b := range blocks {
		src, err := source(b)
		if err != nil {
			t.Errorf("%s:%d: %v", b.file, b.line, err)
			continue
		}
		if strings.Contains(src, module+"/internal/") {
			t.Errorf("%s:%d: imports an internal package, which a user cannot", b.file, b.line)
		}
		tmp := filepath.Join(dir, fmt.Sprintf("s%d.go", i))
		if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		pkg := fmt.Sprintf("test/docs/snippet/s%d", i)
		overlay["Replace"][filepath.Join(abs, pkg, "snippet.go")] = tmp
		pkgs = append(pkgs, "./"+pkg)
	}
	js, _ := json.Marshal(overlay)
	ovf := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ovf, js, 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"build", "-overlay", ovf, "-o", os.DevNull}, pkgs...)
	if len(pkgs) > 1 {
		args = append([]string{"build", "-overlay", ovf}, pkgs...)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = abs
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("the documentation's Go blocks do not build:\n%s", out)
	}
}

// goBlocks returns the ```go blocks of one Markdown file.
func goBlocks(t *testing.T, root, path string) []block {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rel, _ := filepath.Rel(root, path)
	var out []block
	var cur *block
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```go":
			cur = &block{file: filepath.ToSlash(rel), line: n + 1}
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.code += line + "\n"
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Errorf("%s:%d: a ```go block is not closed", cur.file, cur.line)
	}
	return out
}

// addModulePackages adds the module's packages, outside internal/, cmd/
// and test/, to imports by the name in their package clause.
func addModulePackages(t *testing.T, abs string) {
	t.Helper()
	err := filepath.WalkDir(abs, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(abs, path)
		rel = filepath.ToSlash(rel)
		if slices.Contains([]string{"internal", "cmd", "test", "bench", "testdata", "deploy"}, d.Name()) || strings.HasPrefix(d.Name(), ".") && rel != "." {
			return filepath.SkipDir
		}
		files, _ := filepath.Glob(filepath.Join(path, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			pf, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.PackageClauseOnly)
			if err == nil {
				imports[pf.Name.Name] = module + "/" + rel
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// source returns the Go file that builds block b: b itself when it is a
// file, else b as the body of a function, with its imports and a use of
// every name it declares at its top level.
func source(b block) (string, error) {
	directive := fmt.Sprintf("//line %s:%d\n", b.file, b.line)
	if strings.HasPrefix(strings.TrimSpace(b.code), "package ") {
		return directive + b.code, nil
	}
	body := directive + b.code
	wrapped := "package snippet\n\nfunc _(" + fragmentParams + ") error {\n" + body + "}\n"
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", wrapped, 0)
	if err != nil {
		return "", err
	}
	declared := map[string]bool{}
	var uses []string
	fn := f.Decls[0].(*ast.FuncDecl)
	for _, st := range fn.Body.List {
		as, ok := st.(*ast.AssignStmt)
		if !ok || as.Tok != token.DEFINE {
			continue
		}
		for _, l := range as.Lhs {
			if id, ok := l.(*ast.Ident); ok && id.Name != "_" && !declared[id.Name] {
				declared[id.Name] = true
				uses = append(uses, "_ = "+id.Name)
			}
		}
	}
	used := map[string]bool{}
	ast.Inspect(fn, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && !declared[id.Name] && imports[id.Name] != "" {
				used[id.Name] = true
			}
		}
		return true
	})
	for _, p := range strings.Split(fragmentParams, ", ") {
		if typ := strings.Fields(p)[1]; strings.Contains(typ, ".") {
			used[strings.TrimPrefix(strings.Split(typ, ".")[0], "*")] = true
		}
	}
	var imp strings.Builder
	for _, name := range slices.Sorted(maps.Keys(used)) {
		fmt.Fprintf(&imp, "import %s %q\n", name, imports[name])
	}
	return "package snippet\n\n" + imp.String() + "\nfunc _(" + fragmentParams + ") error {\n" +
		body + "\n" + strings.Join(uses, "\n") + "\nreturn nil\n}\n", nil
}
