package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// runVersion is `triage version`: the module's version (a tag when
// installed with go install ...@VERSION, "(devel)" when built in a clone),
// the commit it was built from when the build recorded one, and the Go
// that built it.
func runVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "triage version: unexpected argument %q\n", args[0])
		return 2
	}
	version, commit := "(unknown)", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				if s.Value == "true" && commit != "" {
					commit += "+modified"
				}
			}
		}
	}
	fmt.Fprintf(stdout, "triage %s", version)
	if commit != "" {
		fmt.Fprintf(stdout, " commit %s", commit)
	}
	fmt.Fprintf(stdout, " %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return 0
}

// runHelp is `triage help [COMMAND [SCENARIO]]`: the usage, or a
// command's flags, on stdout.
func runHelp(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0:
		fmt.Fprint(stdout, usage)
		return 0
	case args[0] == "version" || args[0] == "help":
		fmt.Fprint(stdout, usage)
		return 0
	case args[0] == "sim" && len(args) == 1:
		return runSim([]string{"-h"}, stdout, stdout)
	case args[0] == "demo" || args[0] == "loadtest" || args[0] == "quota-server" || args[0] == "proxy" || args[0] == "sidecar" || args[0] == "extproc" || args[0] == "sim":
		if run(ctx, append(args, "-h"), stdout, stdout) == 2 {
			return 2
		}
		return 0
	}
	fmt.Fprintf(stderr, "triage help: unknown command %q\n\n%s", args[0], usage)
	return 2
}
