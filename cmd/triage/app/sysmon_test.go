package app

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestSysmonEnv(t *testing.T) {
	up := []string{"sidecar", "-upstream", "http://127.0.0.1:9"}
	for _, c := range []struct {
		name    string
		args    []string
		environ []string
		want    string // GODEBUG in the result; "" for no re-execution
	}{
		{"another command", []string{"proxy"}, []string{"HOME=/root"}, ""},
		{"no arguments", nil, nil, ""},
		{"the sidecar", up, []string{"HOME=/root"}, "GODEBUG=" + quietSysmon},
		{"beside other settings", up, []string{"GODEBUG=http2debug=1", "HOME=/root"}, "GODEBUG=http2debug=1," + quietSysmon},
		{"an empty GODEBUG", up, []string{"GODEBUG="}, "GODEBUG=" + quietSysmon},
		{"the operator's schedtrace", up, []string{"GODEBUG=gctrace=1,schedtrace=1000"}, ""},
		{"the operator's schedtrace=0", up, []string{"GODEBUG=schedtrace=0"}, ""},
		{"the flag off", append(slices.Clone(up), "-quiet-sysmon=false"), nil, ""},
		{"flags that do not parse", []string{"sidecar", "-upstream", "ftp://x"}, nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			env, ok := sysmonEnv(c.args, c.environ)
			if ok != (c.want != "") {
				t.Fatalf("re-execute: %v, want %v", ok, c.want != "")
			}
			if !ok {
				return
			}
			var got []string
			for _, kv := range env {
				if strings.HasPrefix(kv, "GODEBUG=") {
					got = append(got, kv)
				}
			}
			if len(got) != 1 || got[0] != c.want {
				t.Errorf("GODEBUG %q, want %q", got, c.want)
			}
			for _, kv := range c.environ {
				if !strings.HasPrefix(kv, "GODEBUG=") && !slices.Contains(env, kv) {
					t.Errorf("%q lost from the environment: %q", kv, env)
				}
			}
		})
	}
}

// `triage sidecar` as a process runs with the -quiet-sysmon setting in
// its environment, in the same process (so a supervisor's PID is still the
// sidecar's), and serves; with -quiet-sysmon=false it keeps the
// environment it was given.
func TestSidecarRunsWithQuietSysmon(t *testing.T) {
	if testing.Short() || runtime.GOOS != "linux" {
		t.Skip("starts processes; reads /proc")
	}
	upstream := httptestServer(t)
	for _, quiet := range []bool{true, false} {
		args := []string{"sidecar", "-upstream", "http://" + upstream, "-listen", "127.0.0.1:0"}
		if !quiet {
			args = append(args, "-quiet-sysmon=false")
		}
		cmd, addr, _ := startCLI(t, args)
		environ, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/environ")
		if err != nil {
			t.Fatal(err)
		}
		has := slices.Contains(strings.Split(string(environ), "\x00"), "GODEBUG="+quietSysmon)
		if has != quiet {
			t.Errorf("-quiet-sysmon=%v: GODEBUG=%s in the process's environment: %v", quiet, quietSysmon, has)
		}
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(b) != "upstream\n" {
			t.Errorf("-quiet-sysmon=%v: through the sidecar %d %q", quiet, resp.StatusCode, b)
		}
	}
}

// httptestServer is an upstream answering "upstream" on loopback.
func httptestServer(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "upstream\n") })}
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return lis.Addr().String()
}

// startCLI runs this test binary as the command with args, waits for the
// line saying where it listens, and returns the process (as the command
// started it), that address and its stderr. The process is killed, if it
// still runs, at the test's end.
func startCLI(t *testing.T, args []string) (*exec.Cmd, string, *syncBuffer) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Env = append(os.Environ(), asCLI+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errb := &syncBuffer{}
	cmd.Stderr = errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if cmd.ProcessState == nil {
			cmd.Wait()
		}
	})
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		t.Fatalf("no output; stderr %q", errb.String())
	}
	m := regexp.MustCompile(`listening on (127\.0\.0\.1:[0-9]+)`).FindStringSubmatch(sc.Text())
	if m == nil {
		t.Fatalf("first line %q", sc.Text())
	}
	go func() {
		for sc.Scan() {
		}
	}()
	return cmd, m[1], errb
}
