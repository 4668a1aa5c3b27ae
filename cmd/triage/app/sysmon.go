package app

import (
	"io"
	"strings"
)

// quietSysmon is the GODEBUG setting `triage sidecar` runs with (its
// -quiet-sysmon flag). Go's sysmon thread sleeps deeply while every
// processor is idle and is woken by the next system call, then polls every
// 20 µs for a millisecond; a sidecar in front of a service on the same CPU
// goes idle between requests, so each request woke it and its polls took
// the service's CPU (docs/sidecar.md, "Where the sidecar runs, and what it
// costs"). With schedtrace
// set, sysmon never sleeps deeply and backs off to a 10 ms poll while it
// has nothing to do; the trace itself is due once every 2^31 ms (about 25
// days of the host's uptime), a line on stderr.
const quietSysmon = "schedtrace=2147483647"

// sysmonEnv returns the environment to run `triage sidecar` with when its
// -quiet-sysmon flag is set (the default) and environ's GODEBUG does not
// already set schedtrace, and false otherwise: another command, the flag
// off, a schedtrace the operator chose, or flags that do not parse (the
// command then reports them).
func sysmonEnv(args, environ []string) ([]string, bool) {
	if len(args) == 0 || args[0] != "sidecar" {
		return nil, false
	}
	f, _, ok := parseSidecarFlags(args[1:], io.Discard, &options{})
	if !ok || !f.quietSysmon {
		return nil, false
	}
	out := make([]string, 0, len(environ)+1)
	set := false
	for _, kv := range environ {
		v, isGodebug := strings.CutPrefix(kv, "GODEBUG=")
		if !isGodebug {
			out = append(out, kv)
			continue
		}
		if hasSetting(v, "schedtrace") {
			return nil, false
		}
		if v != "" {
			v += ","
		}
		out = append(out, "GODEBUG="+v+quietSysmon)
		set = true
	}
	if !set {
		out = append(out, "GODEBUG="+quietSysmon)
	}
	return out, true
}

// hasSetting reports whether the GODEBUG value v sets key.
func hasSetting(v, key string) bool {
	for _, kv := range strings.Split(v, ",") {
		if k, _, _ := strings.Cut(kv, "="); strings.TrimSpace(k) == key {
			return true
		}
	}
	return false
}
