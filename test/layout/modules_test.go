package layout

import (
	"archive/zip"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"
	gomodule "golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// TestModulesResolve: every go.mod of the repository requires versions of
// this repository's modules that exist (a tag, or the pseudo-version of a
// commit in its history whose time is the commit's), never v0.0.0 or a
// version only a replace makes good, since a replace in a dependency's
// go.mod is ignored. Then a module outside the tree requires triageotel,
// as a user would, and builds against the core at the version triageotel
// requires, served from a file GOPROXY made from this repository (the
// core from its commit, triageotel from the tree): what `go get
// github.com/triagehq/triage/triageotel` resolves, without a replace.
func TestModulesResolve(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module outside the tree")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command("git", "-C", root, "rev-parse", "--is-shallow-repository").Output(); strings.TrimSpace(string(out)) != "false" {
		t.Skipf("needs the repository's history (git rev-parse --is-shallow-repository: %q); git fetch --unshallow", strings.TrimSpace(string(out)))
	}
	coreVersion := checkRequirements(t, root)
	if coreVersion == "" || t.Failed() {
		t.FailNow()
	}

	// The file proxy: the core at coreVersion from git, triageotel from
	// the tree at a version of its own.
	proxy := t.TempDir()
	core := mod(module, coreVersion)
	rev := coreVersion
	if gomodule.IsPseudoVersion(coreVersion) {
		rev, _ = gomodule.PseudoVersionRev(coreVersion)
	}
	publish(t, proxy, core, func(w *os.File) error { return modzip.CreateFromVCS(w, core, root, rev, "") })
	// A version of its own per run: triageotel is published from the
	// tree, whose content changes, into the machine's module cache.
	otel := mod(module+"/triageotel", fmt.Sprintf("v0.0.0-20990101000000-%012x", rand.Uint64()>>16))
	released := releasedTree(t, filepath.Join(root, "triageotel"))
	publish(t, proxy, otel, func(w *os.File) error { return modzip.CreateFromDir(w, otel, released) })

	user := t.TempDir()
	write(t, filepath.Join(user, "go.mod"), "module example.com/user\n\ngo 1.26.0\n")
	write(t, filepath.Join(user, "main.go"), `package main

import (
	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/triageotel"
)

var _ = triageotel.New
var _ = admission.New

func main() {}
`)
	env := outsideEnv(t, proxy, core, otel)
	for _, args := range [][]string{{"get", otel.Path + "@" + otel.Version}, {"build", "-o", os.DevNull, "."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir, cmd.Env = user, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s in a module outside the tree: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	b, _ := os.ReadFile(filepath.Join(user, "go.mod"))
	if !strings.Contains(string(b), module+" "+coreVersion) {
		t.Errorf("the user's module resolved another core than triageotel requires (%s):\n%s", coreVersion, b)
	}
	// go install ...@VERSION, outside any module: triage version prints
	// the version it was installed at.
	bin := t.TempDir()
	install := exec.Command("go", "install", module+"/cmd/triage@"+coreVersion)
	install.Dir, install.Env = t.TempDir(), append(env, "GOBIN="+bin, "GOFLAGS=-modcacherw")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install %s/cmd/triage@%s: %v\n%s", module, coreVersion, err, out)
	}
	out, err := exec.Command(filepath.Join(bin, "triage"), "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "triage "+coreVersion+" ") {
		t.Errorf("triage version of go install @%s: %q (%v)", coreVersion, out, err)
	}
	// The command with OpenTelemetry builds against the core triageotel
	// requires, and has its flags.
	install = exec.Command("go", "install", otel.Path+"/cmd/triage@"+otel.Version)
	install.Dir, install.Env = t.TempDir(), append(env, "GOBIN="+bin, "GOFLAGS=-modcacherw")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install %s/cmd/triage@%s: %v\n%s", otel.Path, otel.Version, err, out)
	}
	out, err = exec.Command(filepath.Join(bin, "triage"), "help", "sidecar").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "-otlp-endpoint") {
		t.Errorf("triage help sidecar of the OpenTelemetry build: no -otlp-endpoint (%v):\n%s", err, out)
	}
}

// checkRequirements checks that every go.mod beside the core's requires
// a version of this repository's modules that exists, and returns the
// core's version triageotel requires.
func checkRequirements(t *testing.T, root string) string {
	t.Helper()
	var coreVersion string
	for _, gomod := range []string{"triageotel/go.mod", "bench/go.mod", "deploy/kubernetes/check/go.mod"} {
		b, err := os.ReadFile(filepath.Join(root, gomod))
		if err != nil {
			t.Fatal(err)
		}
		f, err := modfile.ParseLax(gomod, b, nil)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, r := range f.Require {
			if r.Mod.Path != module && !strings.HasPrefix(r.Mod.Path, module+"/") {
				continue
			}
			found = true
			if err := versionExists(root, r.Mod); err != nil {
				t.Errorf("%s requires %s: %v", gomod, r.Mod, err)
			}
			if gomod == "triageotel/go.mod" && r.Mod.Path == module {
				coreVersion = r.Mod.Version
			}
		}
		if !found {
			t.Errorf("%s requires no version of %s", gomod, module)
		}
	}
	return coreVersion
}

// outsideEnv is the go command's environment outside the tree: this
// repository's modules from the file proxy at proxy, everything else from
// the module cache this machine already has, then the real proxy. It
// extracts into that module cache, so that the dependencies build from the
// paths the tree's own builds used and hit the build cache (a cache of its
// own, or -trimpath, compiled all of gRPC, OpenTelemetry and the Envoy
// messages again: a minute of a cold run); what it adds of this
// repository's modules (ours) is removed when the test ends.
func outsideEnv(t *testing.T, proxy string, ours ...gomodule.Version) []string {
	t.Helper()
	cache, err := goEnv("GOMODCACHE")
	if err != nil {
		t.Fatal(err)
	}
	goproxy, err := goEnv("GOPROXY")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ours {
		t.Cleanup(func() { removeFromCache(cache, m) })
	}
	return append(os.Environ(),
		"GOPROXY=file://"+proxy+"|file://"+filepath.Join(cache, "cache", "download")+"|"+goproxy,
		"GOFLAGS=-mod=mod -modcacherw", "GOSUMDB=off", "GOWORK=off", "GONOSUMDB=", "GOPRIVATE=")
}

// removeFromCache removes m's download and extracted tree from the module
// cache at cache.
func removeFromCache(cache string, m gomodule.Version) {
	esc, err1 := gomodule.EscapePath(m.Path)
	ver, err2 := gomodule.EscapeVersion(m.Version)
	if err1 != nil || err2 != nil {
		return
	}
	os.RemoveAll(filepath.Join(cache, esc+"@"+ver))
	dl := filepath.Join(cache, "cache", "download", esc, "@v")
	for _, ext := range []string{".info", ".mod", ".zip", ".ziphash", ".lock"} {
		os.Remove(filepath.Join(dl, ver+ext))
	}
	os.Remove(filepath.Join(dl, "list")) // the versions seen; only ours
}

// versionExists says whether m's version is a tag of the repository at
// root (vX.Y.Z for the core, DIR/vX.Y.Z for the module in DIR) or the
// pseudo-version of one of its commits, stamped with that commit's time.
func versionExists(root string, m gomodule.Version) error {
	if gomodule.IsPseudoVersion(m.Version) {
		rev, err := gomodule.PseudoVersionRev(m.Version)
		if err != nil {
			return err
		}
		out, err := exec.Command("git", "-C", root, "show", "-s", "--format=%H %ct", rev+"^{commit}").Output()
		if err != nil {
			return &versionError{m.Version, "names no commit of this repository"}
		}
		hash, secs, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
		when, err := gomodule.PseudoVersionTime(m.Version)
		if err != nil {
			return err
		}
		unix, err := strconv.ParseInt(secs, 10, 64)
		if err != nil {
			return err
		}
		if !when.Equal(time.Unix(unix, 0).UTC()) {
			return &versionError{m.Version, "has a time that is not its commit's (" + time.Unix(unix, 0).UTC().Format("20060102150405") + ", commit " + hash[:12] + ")"}
		}
		return nil
	}
	tag := m.Version
	if dir := strings.TrimPrefix(strings.TrimPrefix(m.Path, module), "/"); dir != "" {
		tag = dir + "/" + m.Version
	}
	if err := exec.Command("git", "-C", root, "rev-parse", "-q", "--verify", "refs/tags/"+tag).Run(); err != nil {
		return &versionError{m.Version, "is neither a tag (" + tag + ") nor the pseudo-version of a commit"}
	}
	return nil
}

type versionError struct{ version, why string }

func (e *versionError) Error() string { return e.version + " " + e.why }

// releasedTree copies a module's tree as its release commit has it
// (RELEASING.md): its go.mod without the replace of the core, which
// `go install PATH@VERSION` refuses.
func releasedTree(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "released")
	if err := os.CopyFS(out, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse("go.mod", b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.DropReplace(module, ""); err != nil {
		t.Fatal(err)
	}
	if b, err = f.Format(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "go.mod"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

func mod(path, version string) gomodule.Version {
	return gomodule.Version{Path: path, Version: version}
}

// publish writes m's .info, .mod and .zip into the file proxy at dir.
func publish(t *testing.T, dir string, m gomodule.Version, create func(*os.File) error) {
	t.Helper()
	escaped, err := gomodule.EscapePath(m.Path)
	if err != nil {
		t.Fatal(err)
	}
	at := filepath.Join(dir, escaped, "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(at, m.Version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	if err := create(f); err != nil {
		t.Fatalf("the module zip of %s: %v", m, err)
	}
	f.Close()
	gomod, err := goModIn(filepath.Join(at, m.Version+".zip"), m)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(at, m.Version+".mod"), gomod)
	write(t, filepath.Join(at, m.Version+".info"), `{"Version":"`+m.Version+`"}`)
	write(t, filepath.Join(at, "list"), m.Version+"\n")
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func goEnv(name string) (string, error) {
	out, err := exec.Command("go", "env", name).Output()
	return strings.TrimSpace(string(out)), err
}

// goModIn returns the go.mod inside m's module zip.
func goModIn(zipPath string, m gomodule.Version) (string, error) {
	z, err := zip.OpenReader(zipPath)
	if err != nil {
		return "", err
	}
	defer z.Close()
	for _, f := range z.File {
		if f.Name == m.Path+"@"+m.Version+"/go.mod" {
			r, err := f.Open()
			if err != nil {
				return "", err
			}
			defer r.Close()
			b, err := io.ReadAll(r)
			return string(b), err
		}
	}
	return "", &versionError{m.Version, "has no go.mod in its zip"}
}
