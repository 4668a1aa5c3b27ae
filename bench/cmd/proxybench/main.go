// Command proxybench measures the batch proxy's throughput on one core
// (SRE book ch. 21, "Load from Connections"): the proxy runs as its own
// process, GOMAXPROCS=1, pinned to one CPU; an empty backend and a
// closed-loop client run in this process on the other CPU. It reports the
// calls forwarded per second and the proxy's CPU over the same time, so
// that calls per CPU-second is the proxy's throughput on one core even
// when the other side is the bottleneck.
//
//	go run ./cmd/proxybench
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/triagegrpc/batchproxy"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/bench/internal/child"
	"github.com/triagehq/triage/bench/internal/clientopts"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

func main() {
	if len(os.Args) > 3 && os.Args[1] == "proxy" {
		if err := proxyMain(os.Args[2], os.Args[3] == "true"); err != nil {
			fmt.Fprintln(os.Stderr, "proxybench proxy:", err)
			os.Exit(1)
		}
		return
	}
	fs := flag.NewFlagSet("proxybench", flag.ContinueOnError)
	callers := fs.Int("callers", 64, "concurrent callers (closed loop)")
	d := fs.Duration("duration", 5*time.Second, "measured time (after 1 s of warm-up)")
	repeats := fs.Int("repeats", 3, "runs")
	proxyCPU := fs.String("proxy-cpu", "0", "CPU for the proxy (taskset); empty for none")
	loadCPU := fs.String("load-cpu", "1", "CPU for the backend and the client; empty for none")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *callers < 1 || *callers > 4096 || *d < time.Second || *d > 5*time.Minute || *repeats < 1 || *repeats > 20 {
		fmt.Fprintln(os.Stderr, "proxybench: need 1 <= callers <= 4096, 1s <= duration <= 5m, 1 <= repeats <= 20")
		os.Exit(2)
	}
	child.PinSelf(*loadCPU)
	if err := run(*callers, *d, *repeats, *proxyCPU); err != nil {
		fmt.Fprintln(os.Stderr, "proxybench:", err)
		os.Exit(1)
	}
}

func run(callers int, d time.Duration, repeats int, proxyCPU string) error {
	pol := trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})
	bs, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(pol)))
	if err != nil {
		return err
	}
	backend := grpc.NewServer(bs.ServerOptions()...)
	relay.Register(backend, &relay.Tier{Name: "backend"})
	blis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go backend.Serve(blis)
	defer backend.Stop()
	fmt.Printf("%d callers, %v per run; proxy on CPU %q (GOMAXPROCS=1)\n", callers, d, proxyCPU)
	fmt.Println("run  admission  calls/s  rejected/s  proxy CPU  calls per proxy CPU-second")
	for r := range repeats {
		for _, adm := range []bool{true, false} {
			px, err := child.Start(proxyCPU, "proxy", blis.Addr().String(), strconv.FormatBool(adm))
			if err != nil {
				return err
			}
			rate, rejected, cpu, err := load(px, callers, d)
			px.Stop()
			if err != nil {
				return err
			}
			fmt.Printf("%3d  %9v  %7.0f  %10.0f  %9.2f  %26.0f\n", r+1, adm, rate, rejected, cpu, rate/cpu)
		}
	}
	return nil
}

// load runs callers closed-loop through the proxy for d after a second of
// warm-up, and returns calls answered and rejected (by the proxy's
// admission control) per second, and the proxy's CPU share.
func load(px *child.Process, callers int, d time.Duration) (rate, rejected, cpu float64, err error) {
	cc, err := grpc.NewClient(px.Addr, append(clientopts.MustDial([]egress.Option{egress.WithoutPolicy()}),
		grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return 0, 0, 0, err
	}
	defer cc.Close()
	var n atomic.Int64
	var failed atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), d+3*time.Second) // ended by cancel after the reading; the timeout is a backstop
	defer cancel()
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if _, err := relay.Invoke(ctx, cc, "x"); err != nil {
					if ctx.Err() == nil {
						if failed.Add(1) == 1 {
							fmt.Fprintln(os.Stderr, "first failure:", err)
						}
					}
					continue
				}
				n.Add(1)
			}
		}()
	}
	time.Sleep(time.Second) // warm-up
	n0, f0, c0, t0 := n.Load(), failed.Load(), px.CPU(), time.Now()
	time.Sleep(d)
	n1, f1, c1, el := n.Load(), failed.Load(), px.CPU(), time.Since(t0)
	cancel()
	wg.Wait()
	return float64(n1-n0) / el.Seconds(), float64(f1-f0) / el.Seconds(), (c1 - c0) / el.Seconds(), nil
}

// proxyMain is the proxy process: triage's batch proxy, with or without
// its own admission control, forwarding to backend.
func proxyMain(backend string, withAdmission bool) error {
	if _, _, err := net.SplitHostPort(backend); err != nil {
		return errors.New("usage: proxybench proxy HOST:PORT")
	}
	pol := trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})
	cc, err := grpc.NewClient(backend, append(clientopts.MustDial([]egress.Option{egress.WithoutPolicy()}),
		grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return err
	}
	px, err := batchproxy.New(cc)
	if err != nil {
		return err
	}
	opts := []triagegrpc.ServerOption{triagegrpc.WithIntake(intake.WithTrust(pol))}
	if withAdmission {
		ctl, err := admission.New()
		if err != nil {
			return err
		}
		opts = append(opts, triagegrpc.WithIntake(intake.WithAdmission(ctl)))
	}
	ts, err := triagegrpc.NewServer(opts...)
	if err != nil {
		return err
	}
	s := grpc.NewServer(append(ts.ServerOptions(), px.ServerOptions()...)...)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Printf("LISTEN %s\n", lis.Addr())
	os.Stdout.Sync()
	return s.Serve(lis)
}
