package check

import (
	"bufio"
	"debug/elf"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction.
type instruction struct{ op, args string }

func dockerfile(t *testing.T) []instruction {
	t.Helper()
	f, err := os.Open(filepath.Join(repo, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []instruction
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			t.Fatalf("Dockerfile: a continued line (%q); the check reads one instruction a line", line)
		}
		op, args, _ := strings.Cut(line, " ")
		out = append(out, instruction{strings.ToUpper(op), strings.TrimSpace(args)})
	}
	return out
}

// The Dockerfile builds in a Go stage of go.mod's Go release and ships a
// static binary alone on distroless's static image, as a non-root user,
// with the binary as the entrypoint; its build command, run here on the
// files .dockerignore lets into the build context, gives a statically
// linked executable that runs.
func TestDockerfile(t *testing.T) {
	ins := dockerfile(t)
	var froms []string
	var build, user, entry, copyBin string
	goVersion := ""
	for _, in := range ins {
		switch in.op {
		case "ARG":
			if v, ok := strings.CutPrefix(in.args, "GO_VERSION="); ok {
				goVersion = v
			}
		case "FROM":
			froms = append(froms, in.args)
			user, entry = "", "" // per stage: the last stage's count
		case "RUN":
			if strings.Contains(in.args, "go build") {
				build = in.args
			}
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entry = in.args
		case "COPY":
			if strings.HasPrefix(in.args, "--from=") {
				copyBin = in.args
			}
		}
	}
	if len(froms) < 2 {
		t.Fatalf("Dockerfile: %d stages, want a build stage and a runtime stage", len(froms))
	}
	if !strings.HasPrefix(froms[0], "golang:${GO_VERSION}") {
		t.Errorf("the build stage is %q, want golang:${GO_VERSION}", froms[0])
	}
	modGo := goLine(t)
	if !strings.HasPrefix(goVersion, modGo) {
		t.Errorf("GO_VERSION %q is not go.mod's Go release %s", goVersion, modGo)
	}
	final := froms[len(froms)-1]
	if !regexp.MustCompile(`^gcr\.io/distroless/static-debian\d+:nonroot$`).MatchString(final) && final != "scratch" {
		t.Errorf("the runtime image is %q, want distroless static (nonroot) or scratch", final)
	}
	if uid, _, _ := strings.Cut(user, ":"); uid == "" || uid == "0" || uid == "root" {
		t.Errorf("the runtime stage runs as %q, want a non-root user", user)
	}
	if entry != `["/triage"]` || copyBin != "--from=build /out/triage /triage" {
		t.Errorf("entrypoint %s from %q, want [\"/triage\"] copied from the build stage's /out/triage", entry, copyBin)
	}
	if !strings.Contains(build, "CGO_ENABLED=0") {
		t.Errorf("the build command %q does not disable cgo: the binary would need libc, which the image has not", build)
	}

	ctx := t.TempDir()
	ignore := dockerignore(t)
	copyTree(t, repo, ctx, func(rel string) bool { return ignore(rel) })
	out := t.TempDir()
	cmd := exec.Command("sh", "-c", strings.ReplaceAll(build, "/out/", out+"/"))
	cmd.Dir = ctx
	// The build arguments a release passes (RELEASING.md).
	cmd.Env = append(os.Environ(), "VERSION=v9.8.7", "COMMIT=0123456789abcdef")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's build (%s) in its build context: %v\n%s", build, err, b)
	}
	bin := filepath.Join(out, "triage")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary asks for a dynamic loader: it is not static")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the binary needs %v", libs)
	}
	if b, err := exec.Command(bin, "version").CombinedOutput(); err != nil || !strings.HasPrefix(string(b), "triage v9.8.7 commit 0123456789abcdef ") {
		t.Errorf("triage version of the image's binary built with VERSION=v9.8.7 COMMIT=0123456789abcdef: %v\n%s", err, b)
	}
}

// goLine is go.mod's Go release ("1.26").
func goLine(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(repo, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	return string(m[1])
}

// dockerignore returns whether .dockerignore keeps a path (relative to
// the repository, slash-separated) out of the build context: a pattern
// matches the path or a directory above it; "**/" matches at any depth.
func dockerignore(t *testing.T) func(rel string) bool {
	b, err := os.ReadFile(filepath.Join(repo, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			if strings.HasPrefix(line, "!") {
				t.Fatalf(".dockerignore: exceptions (%q) are not read by this check", line)
			}
			patterns = append(patterns, line)
		}
	}
	return func(rel string) bool {
		parts := strings.Split(rel, "/")
		for _, p := range patterns {
			deep := strings.HasPrefix(p, "**/")
			p = strings.TrimPrefix(p, "**/")
			for i := range parts {
				for j := i + 1; j <= len(parts); j++ {
					if !deep && i > 0 {
						break
					}
					if ok, _ := path.Match(p, strings.Join(parts[i:j], "/")); ok {
						return true
					}
				}
			}
		}
		return false
	}
}
