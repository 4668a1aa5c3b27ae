package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/triagehq/triage/bench/internal/child"
	"github.com/triagehq/triage/bench/internal/clientopts"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/retry"
)

// backend is a running server process.
type backend struct{ *child.Process }

func startBackend(cfg config, variant string) (*backend, error) {
	p, err := child.Start(cfg.serverCPU, "server", "--variant", variant, "--rounds", strconv.Itoa(cfg.rounds))
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", variant, err)
	}
	if p.Admin == "" {
		p.Stop()
		return nil, fmt.Errorf("backend %s announced no admin address", variant)
	}
	return &backend{p}, nil
}

func (b *backend) stop() { b.Stop() }

type stats struct {
	Goroutines int              `json:"goroutines"`
	RSSMB      float64          `json:"rss_mb"`
	Limit      int              `json:"limit"`
	Executing  int              `json:"executing"`
	Queued     int              `json:"queued"`
	Pending    int              `json:"pending"`
	ServiceMS  float64          `json:"service_ms"`
	PendingCap float64          `json:"pending_cap"`
	Rejected   map[string]int64 `json:"rejected"`
}

func (b *backend) stats() (stats, error) {
	var s stats
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + b.Admin + "/stats")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// retries counts a client's retries per criticality.
type retries struct {
	n [criticality.NumLevels]atomic.Int64
}

func (*retries) Requested(criticality.Level)      {}
func (*retries) Answered(criticality.Level, bool) {}
func (*retries) Throttled(criticality.Level)      {}
func (r *retries) Retried(l criticality.Level)    { r.n[l].Add(1) }
func (*retries) BudgetRefused(criticality.Level)  {}
func (*retries) Exhausted(criticality.Level)      {}

// snapshot returns the counts so far.
func (r *retries) snapshot() (out [criticality.NumLevels]int64) {
	for l := range out {
		out[l] = r.n[l].Load()
	}
	return out
}

// dial connects to the backend: the triage variants through triage's
// client (its retries counted in the returned retries), the others
// plainly.
func dial(cfg config, b *backend, variant string) ([]grpc.ClientConnInterface, *retries, func(), error) {
	var extra []grpc.DialOption
	var count *retries
	if variant == "triage" || variant == "triage-no-retry-after" {
		count = new(retries)
		pol, err := retry.New(retry.WithObserver(count))
		if err != nil {
			return nil, nil, nil, err
		}
		extra = clientopts.MustDial([]egress.Option{egress.WithPolicy(pol)}) // one client: one throttle and budget for the backend
	} else {
		extra = clientopts.MustDial([]egress.Option{egress.WithoutPolicy()})
	}
	var ccs []grpc.ClientConnInterface
	var closers []func()
	for i := 0; i < cfg.conns; i++ {
		cc, err := grpc.NewClient("passthrough:///"+b.Addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, extra...)...)
		if err != nil {
			return nil, nil, nil, err
		}
		ccs = append(ccs, cc)
		closers = append(closers, func() { cc.Close() })
	}
	return ccs, count, func() {
		for _, c := range closers {
			c()
		}
	}, nil
}
