// Command triage is the toolkit's CLI. It only parses flags, handles signals
// and wires packages together.
//
//	triage demo [flags]              run the loopback demo stack (see internal/demo)
//	triage sim subsetting [flags]    connections per backend under a subsetting algorithm
//	triage sim throttle|retry|stack   the book's throttling and retry experiments (package sim)
//	triage quota-server [flags]      the global quota service
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/triagehq/triage/internal/demo"
)

const usage = `triage keeps RPC services standing under overload (SRE book ch. 20-21).

Usage:
  triage demo [flags]    run an HTTP frontend and two gRPC tiers on loopback and
                         show criticality and overload outcomes across the hops

  triage sim subsetting [flags]
                         connections per backend under deterministic, random or
                         ringsteady subsetting (Figures 20-3 to 20-5), and churn

  triage sim lb|throttle|retry|stack|shed|cascade [flags]
                         the book's balancing, throttling, retry and shedding
                         experiments on virtual time, next to the book's numbers
                         (--out DIR: figures and a self-contained HTML page)

  triage quota-server -config FILE [-listen ADDR] [flags]
                         the quota service: tasks report per-customer CPU usage
                         and lease their share of each customer's limit

  triage proxy -backends ADDR,... [-listen ADDR] [flags]
                         the batch proxy: batch clients call it instead of the
                         backends; it forwards any method, with its own admission
                         control, over few connections (the book's fuse)

Run 'triage demo -h', 'triage sim SCENARIO -h', 'triage quota-server -h' or
'triage proxy -h' for the flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "demo":
		return runDemo(ctx, args[1:], stdout, stderr)
	case "sim":
		return runSim(args[1:], stdout, stderr)
	case "quota-server":
		return runQuotaServer(ctx, args[1:], stdout, stderr)
	case "proxy":
		return runProxy(ctx, args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "triage: unknown command %q\n\n%s", args[0], usage)
	return 2
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("triage demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	requests := fs.Int("requests", 25, "requests per scenario (1-10000)")
	config := fs.String("config", "", "YAML file with the frontend's trust and criticality rules (default: built in; see -print-config)")
	printConfig := fs.Bool("print-config", false, "print the built-in frontend configuration and exit")
	timeout := fs.Duration("timeout", 5*time.Second, "per-request timeout")
	deadline := fs.Duration("max-duration", 50*time.Second, "stop the whole demo after this long")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "triage demo: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *printConfig {
		fmt.Fprint(stdout, demo.DefaultConfig)
		return 0
	}
	if *requests < 1 || *requests > 10000 {
		fmt.Fprintf(stderr, "triage demo: -requests must be between 1 and 10000, got %d\n", *requests)
		return 2
	}
	if *timeout <= 0 || *deadline <= 0 {
		fmt.Fprintln(stderr, "triage demo: -timeout and -max-duration must be positive")
		return 2
	}
	var cfg []byte
	if *config != "" {
		b, err := os.ReadFile(*config)
		if err != nil {
			fmt.Fprintf(stderr, "triage demo: %v\n", err)
			return 1
		}
		cfg = b
	}
	ctx, cancel := context.WithTimeout(ctx, *deadline)
	defer cancel()
	if _, err := demo.Run(ctx, stdout, demo.Options{Requests: *requests, Config: cfg, Timeout: *timeout}); err != nil {
		fmt.Fprintf(stderr, "triage demo: %v\n", err)
		return 1
	}
	return 0
}
