package app

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// runVersion is `triage version` (or --version): the module's version and
// the commit it was built from, from -ldflags when the build set them,
// else from the build info (the tag with go install ...@VERSION, a
// pseudo-version and vcs.revision with go build in a clone, "(devel)"
// without either), and the Go that built it.
func runVersion(args []string, stdout, stderr io.Writer, o *options) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "triage version: unexpected argument %q\n", args[0])
		return 2
	}
	v, c := buildVersion(o)
	fmt.Fprintf(stdout, "triage %s", v)
	if c != "" {
		fmt.Fprintf(stdout, " commit %s", c)
	}
	fmt.Fprintf(stdout, " %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return 0
}

// runHelp is `triage help [COMMAND [SCENARIO]]`: the usage, or a
// command's flags, on stdout.
func runHelp(ctx context.Context, args []string, stdout, stderr io.Writer, o *options) int {
	switch {
	case len(args) == 0:
		fmt.Fprint(stdout, helpText)
		return 0
	case args[0] == "version" || args[0] == "help":
		fmt.Fprint(stdout, helpText)
		return 0
	case args[0] == "sim" && len(args) == 1:
		return runSim([]string{"-h"}, stdout, stdout)
	case args[0] == "demo" || args[0] == "loadtest" || args[0] == "quota-server" || args[0] == "proxy" || args[0] == "sidecar" || args[0] == "extproc" || args[0] == "sim":
		if runWith(ctx, append(args, "-h"), stdout, stdout, func(opt *options) { *opt = *o }) == 2 {
			return 2
		}
		return 0
	}
	fmt.Fprintf(stderr, "triage help: unknown command %q\n\n%s", args[0], helpText)
	return 2
}

// buildVersion returns the version and commit of this binary: the
// -ldflags values where set, the build info's otherwise.
func buildVersion(o *options) (string, string) {
	v, c := "(unknown)", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
		modified := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				c = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if modified && c != "" {
			c += "+modified"
		}
	}
	if o.version != "" {
		v = o.version
	}
	if o.commit != "" {
		c = o.commit
	}
	return v, c
}
