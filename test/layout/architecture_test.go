package layout

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// maxArchitecture bounds ARCHITECTURE.md: a map, not a ledger.
const maxArchitecture = 15 << 10

// ARCHITECTURE.md is a map: it names every package of the module and the
// root of every module nested in the tree, names nothing that does not
// exist, and stays under maxArchitecture bytes.
func TestArchitectureIsAMap(t *testing.T) {
	root := filepath.Join("..", "..")
	b, err := os.ReadFile(filepath.Join(root, "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > maxArchitecture {
		t.Errorf("ARCHITECTURE.md is %d bytes, more than %d: a map, with the detail in go doc and docs/", len(b), maxArchitecture)
	}
	named := map[string]bool{}
	row := regexp.MustCompile("^\\| `([^`]+)` \\|")
	for _, line := range strings.Split(string(b), "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			named[m[1]] = true
		}
	}
	for name := range named {
		if fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(name))); err != nil || !fi.IsDir() {
			t.Errorf("ARCHITECTURE.md names %s, which is not a directory of the tree", name)
		}
	}
	for _, p := range packagesAndModules(t, root) {
		if !named[p] {
			t.Errorf("ARCHITECTURE.md does not name %s", p)
		}
	}
}

// packagesAndModules returns the directories of the module's packages
// (non-test Go files) and the roots of the modules nested in it, with
// slashes, relative to root.
func packagesAndModules(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	seen := map[string]bool{}
	nested := map[string]bool{} // nested module roots, whose packages are theirs
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != root {
				nested[rel] = true
				out = append(out, rel)
				if rel != "triageotel" {
					return filepath.SkipDir // bench's and the kit check's packages are their module's business
				}
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		dir := filepath.ToSlash(filepath.Dir(rel))
		if dir == "." || seen[dir] || nested[dir] {
			return nil
		}
		seen[dir] = true
		out = append(out, dir)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
