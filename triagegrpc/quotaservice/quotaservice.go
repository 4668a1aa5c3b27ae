// Package quotaservice is triage's quota service over gRPC (SRE book ch.
// 21, "Per-Customer Limits"; Doorman): Service serves a allocate.Allocator,
// to which each task reports its customers' usage and from which it
// leases its limits; Client is the task's side, which keeps a
// quota.Leased fresh. The wire messages are in quotapb.
package quotaservice

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/quota/allocate"
	"github.com/triagehq/triage/quota/usage"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotapb"
	"github.com/triagehq/triage/trust"
	"github.com/triagehq/triage/wire"
)

// Service serves the quota service's protocol (quotapb.Quota) over a
// allocate.Allocator: `triage quota-server` is this plus a listener and a
// policy file. A malformed report is refused with INVALID_ARGUMENT naming
// the problem; a task beyond the Allocator's bound with
// RESOURCE_EXHAUSTED.
//
// Without WithTaskIdentities, a report's task id is believed as sent:
// serve such a Service only to callers the network already vouches for.
// With it, a caller reports only as the tasks its verified client
// certificate names (see WithTaskIdentities), so that no caller can claim
// another task's shares or fill the Allocator's task slots with made-up
// tasks.
//
// A Service is safe for concurrent use; its memory is the Allocator's,
// bounded by its tasks and their reports, plus the identity map.
type Service struct {
	quotapb.UnimplementedQuotaServer
	alloc     *allocate.Allocator
	bind      bool
	boundOnly bool // an identity not in tasks is refused
	tasks     map[string]string
	log       func(task string, ls quota.Lease)
}

// ServiceOption configures a Service.
type ServiceOption interface{ apply(*Service) }

type serviceOptionFunc func(*Service)

func (f serviceOptionFunc) apply(s *Service) { f(s) }

// WithTaskIdentities binds task ids to callers' verified identities (the
// URI and DNS SANs of a client certificate the server's TLS configuration
// verified): a caller may report as the task tasks maps one of its
// identities to, or, for an identity tasks does not list, as the identity
// itself (a SPIFFE ID such as spiffe://prod/quota-task/db-0 is a valid
// task id). A caller without a verified identity is refused with
// UNAUTHENTICATED, a report as any other task with PERMISSION_DENIED. A
// nil map binds every task to its identity. Use it with a server whose
// TLS configuration requires and verifies client certificates.
func WithTaskIdentities(tasks map[string]string) ServiceOption {
	m := make(map[string]string, len(tasks))
	for id, task := range tasks {
		m[id] = task
	}
	return serviceOptionFunc(func(s *Service) { s.bind, s.tasks = true, m })
}

// WithGrantLog calls log with every lease the Service grants, before the
// lease is sent (an audit trail: `triage quota-server -grant-log` writes
// one JSON line per lease). log runs on the Refresh call's goroutine and
// must not block.
func WithGrantLog(log func(task string, ls quota.Lease)) ServiceOption {
	return serviceOptionFunc(func(s *Service) { s.log = log })
}

// WithBoundIdentitiesOnly, with WithTaskIdentities, refuses a caller
// none of whose identities the map binds (PERMISSION_DENIED), instead of
// letting it report as the identity itself. Use it where the CA that
// verifies callers vouches for more than the tasks (a mesh's CA, SPIFFE's
// trust domain): there any workload could otherwise report, as a task
// named after itself, and take a share of every customer's limit.
func WithBoundIdentitiesOnly() ServiceOption {
	return serviceOptionFunc(func(s *Service) { s.boundOnly = true })
}

// NewService returns the service; register it with
// quotapb.RegisterQuotaServer on any grpc.Server.
func NewService(a *allocate.Allocator, opts ...ServiceOption) *Service {
	s := &Service{alloc: a}
	for _, o := range opts {
		o.apply(s)
	}
	return s
}

// Refresh implements quotapb.QuotaServer.
func (s *Service) Refresh(ctx context.Context, req *quotapb.RefreshRequest) (*quotapb.RefreshResponse, error) {
	if s.bind {
		if err := s.authorize(ctx, req.GetTask()); err != nil {
			return nil, err
		}
	}
	r, err := reportFromProto(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ls, err := s.alloc.Refresh(r)
	switch {
	case errors.Is(err, allocate.ErrTooManyTasks):
		return nil, status.Error(codes.ResourceExhausted, err.Error())
	case err != nil:
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if s.log != nil {
		s.log(r.Task, ls)
	}
	return leaseToProto(ls), nil
}

// authorize checks that the caller's verified identity names task.
func (s *Service) authorize(ctx context.Context, task string) error {
	var ids []string
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			ids = trust.Identities(&info.State)
		}
	}
	if len(ids) == 0 {
		return status.Error(codes.Unauthenticated, "quotaservice: the caller has no verified client certificate")
	}
	for _, id := range ids {
		if mapped, ok := s.tasks[id]; ok {
			if mapped == task {
				return nil
			}
		} else if id == task && !s.boundOnly {
			return nil
		}
	}
	return status.Errorf(codes.PermissionDenied, "quotaservice: identity %.128q may not report as task %.128q", ids[0], task)
}

// reportFromProto decodes and validates a task's report.
func reportFromProto(req *quotapb.RefreshRequest) (quota.Report, error) {
	if req == nil {
		return quota.Report{}, errors.New("quota: empty request")
	}
	if len(req.GetCustomers()) > quota.MaxReportCustomers {
		return quota.Report{}, fmt.Errorf("quota: report has %d customers, at most %d", len(req.GetCustomers()), quota.MaxReportCustomers)
	}
	r := quota.Report{Task: req.GetTask(), NoLease: req.GetNoLease(), Customers: make([]usage.Customer, 0, len(req.GetCustomers()))}
	for _, c := range req.GetCustomers() {
		if len(c.GetUsed()) > criticality.NumLevels {
			return quota.Report{}, fmt.Errorf("quota: customer %.64q: %d usage values, at most %d", c.GetCustomer(), len(c.GetUsed()), criticality.NumLevels)
		}
		cu := usage.Customer{Customer: c.GetCustomer(), Demand: c.GetDemand(), Share: c.GetShare()}
		copy(cu.Used[:], c.GetUsed())
		r.Customers = append(r.Customers, cu)
	}
	return r, r.Validate()
}

func reportToProto(r quota.Report) *quotapb.RefreshRequest {
	req := &quotapb.RefreshRequest{Task: r.Task, NoLease: r.NoLease, Customers: make([]*quotapb.CustomerUsage, 0, len(r.Customers))}
	for _, c := range r.Customers {
		req.Customers = append(req.Customers, &quotapb.CustomerUsage{Customer: c.Customer, Used: c.Used[:], Demand: c.Demand, Share: c.Share})
	}
	return req
}

func grantToProto(g quota.Grant) *quotapb.Grant {
	return &quotapb.Grant{Customer: g.Customer, Cpu: g.CPU, ByCriticality: g.ByCriticality[:], Hard: g.Hard, Share: g.Share}
}

func leaseToProto(ls quota.Lease) *quotapb.RefreshResponse {
	resp := &quotapb.RefreshResponse{
		Default: grantToProto(ls.Default), LeaseMs: ls.Duration.Milliseconds(), RefreshMs: ls.Refresh.Milliseconds(),
		Fallback: string(ls.Fallback), Tasks: int32(ls.Tasks), Partial: ls.Partial, Grants: make([]*quotapb.Grant, 0, len(ls.Grants)),
	}
	for _, g := range ls.Grants {
		resp.Grants = append(resp.Grants, grantToProto(g))
	}
	return resp
}

func grantFromProto(g *quotapb.Grant) (quota.Grant, error) {
	if g == nil {
		return quota.Grant{}, errors.New("quota: missing grant")
	}
	if len(g.GetByCriticality()) > criticality.NumLevels {
		return quota.Grant{}, errors.New("quota: grant has too many criticality limits")
	}
	out := quota.Grant{Customer: g.GetCustomer(), CPU: g.GetCpu(), Hard: g.GetHard(), Share: g.GetShare()}
	copy(out.ByCriticality[:], g.GetByCriticality())
	return out, nil
}

// leaseFromProto decodes and validates a lease.
func leaseFromProto(resp *quotapb.RefreshResponse) (quota.Lease, error) {
	const maxMs = int64(24 * time.Hour / time.Millisecond)
	if resp.GetLeaseMs() <= 0 || resp.GetLeaseMs() > maxMs || resp.GetRefreshMs() <= 0 || resp.GetRefreshMs() > maxMs {
		return quota.Lease{}, errors.New("quota: lease duration or refresh out of range")
	}
	if len(resp.GetGrants()) > quota.MaxReportCustomers {
		return quota.Lease{}, errors.New("quota: lease has too many grants")
	}
	def, err := grantFromProto(resp.GetDefault())
	if err != nil {
		return quota.Lease{}, err
	}
	ls := quota.Lease{
		Default: def, Duration: time.Duration(resp.GetLeaseMs()) * time.Millisecond,
		Refresh:  time.Duration(resp.GetRefreshMs()) * time.Millisecond,
		Fallback: quota.Fallback(resp.GetFallback()), Tasks: int(resp.GetTasks()), Partial: resp.GetPartial(),
		Grants: make([]quota.Grant, 0, len(resp.GetGrants())),
	}
	for _, g := range resp.GetGrants() {
		gg, err := grantFromProto(g)
		if err != nil {
			return quota.Lease{}, err
		}
		ls.Grants = append(ls.Grants, gg)
	}
	return ls, ls.Validate()
}

// Client keeps one task's lease from the quota service fresh: every
// refresh interval (the service's, ±25% jitter) it reports the task's
// Usage and installs the lease it gets into a quota.Leased. When the
// service cannot be reached it retries with jittered exponential backoff,
// from a tenth of the refresh interval up to the interval itself (±50%),
// so tasks never come back in lockstep; meanwhile the Leased keeps the
// last lease until it expires, then applies the fallback. The first
// report goes out after a random delay of up to a quarter of the interval.
//
// Run is the only goroutine, and it stops when its context is done.
type Client struct {
	client   quotapb.QuotaClient
	replicas []replicaConn // WithReplicas; empty for one service
	current  atomic.Int64  // the replica asked first
	task     string
	usage    *usage.Table
	leased   *quota.Leased
	clock    clock.Clock
	random   func() float64
	refresh  time.Duration // until a lease says otherwise

	ok, failed atomic.Uint64
}

// ClientOption configures a Client.
type ClientOption interface{ apply(*Client) }

type clientOptionFunc func(*Client)

func (f clientOptionFunc) apply(c *Client) { f(c) }

// replicaConn is one replica of a replicated quota service.
type replicaConn struct {
	addr   string
	client quotapb.QuotaClient
}

// MaxReplicas bounds the replicas a Client is given (WithReplicas).
const MaxReplicas = 64

// WithReplicas makes the Client one of a replicated quota service's
// (quotareplica.Replica): conns maps each replica's advertised address to a connection
// to it, and the connection given to NewClient is not used. A refresh asks
// the replica it last got a lease from; one that refuses and names the
// leader (wire.QuotaLeaderKey) is followed at once, and one that fails
// otherwise is passed over for the next, each replica at most once per
// refresh (a named leader already asked is passed over too); the Run
// loop's jittered backoff paces the rounds. At most MaxReplicas.
func WithReplicas(conns map[string]grpc.ClientConnInterface) ClientOption {
	return clientOptionFunc(func(c *Client) {
		c.replicas = c.replicas[:0]
		for addr, cc := range conns {
			c.replicas = append(c.replicas, replicaConn{addr, quotapb.NewQuotaClient(cc)})
		}
		slices.SortFunc(c.replicas, func(a, b replicaConn) int { return strings.Compare(a.addr, b.addr) })
	})
}

// WithRefresh sets the refresh interval used until the first lease
// names one. Default 5 s.
func WithRefresh(d time.Duration) ClientOption {
	return clientOptionFunc(func(c *Client) { c.refresh = d })
}

// WithClock sets the clock of the client's timers. Default
// clock.Real().
func WithClock(clk clock.Clock) ClientOption {
	return clientOptionFunc(func(c *Client) { c.clock = clk })
}

// WithRandom sets the jitter source, uniform in [0, 1). Default
// math/rand/v2.
func WithRandom(f func() float64) ClientOption {
	return clientOptionFunc(func(c *Client) { c.random = f })
}

// NewClient returns a client for task (its id among the service's
// tasks, a valid customer-style name) that reports u and fills l, over cc
// (see DialOptions).
func NewClient(cc grpc.ClientConnInterface, task string, u *usage.Table, l *quota.Leased, opts ...ClientOption) (*Client, error) {
	if err := quota.ValidName(task); err != nil {
		return nil, fmt.Errorf("quotaservice: quota task id: %v", err)
	}
	if u == nil || l == nil {
		return nil, errors.New("quotaservice: a Client needs a connection, a Usage and a Leased")
	}
	c := &Client{task: task, usage: u, leased: l, random: rand.Float64, refresh: 5 * time.Second}
	for _, o := range opts {
		o.apply(c)
	}
	if len(c.replicas) > MaxReplicas {
		return nil, fmt.Errorf("quotaservice: %d replicas, at most %d", len(c.replicas), MaxReplicas)
	}
	if len(c.replicas) == 0 {
		if cc == nil {
			return nil, errors.New("quotaservice: a Client needs a connection, a Usage and a Leased")
		}
		c.client = quotapb.NewQuotaClient(cc)
	}
	if c.refresh <= 0 {
		return nil, errors.New("quotaservice: quota refresh must be positive")
	}
	c.clock = clock.OrReal(c.clock)
	return c, nil
}

// MaxMessageSize bounds a report and a lease on the wire, both ways. The
// largest of either (quotapb.MaxEntries entries with names of the
// longest) is about 2 MiB.
const MaxMessageSize = 4 << 20

// MaxStreams bounds the calls one connection may have in flight at the
// service: a task makes one at a time.
const MaxStreams = 16

// ServerOptions returns the grpc.Server options the service is meant to
// run with: messages up to MaxMessageSize, MaxStreams calls per
// connection, and keepalive pings from clients at most every 10 s.
// Transport security (grpc.Creds) is the caller's to add.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxMessageSize), grpc.MaxSendMsgSize(MaxMessageSize),
		grpc.MaxConcurrentStreams(MaxStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
}

// DialOptions returns dial options suited to the quota service: the
// channel reconnects at least every refresh/2 (grpc's default backoff
// grows to two minutes, far longer than a lease), and messages up to
// MaxMessageSize both ways. Transport security
// (grpc.WithTransportCredentials) is the caller's to add.
func DialOptions(refresh time.Duration) []grpc.DialOption {
	bc := backoff.DefaultConfig
	bc.BaseDelay = min(bc.BaseDelay, refresh/10)
	bc.MaxDelay = max(refresh/2, time.Millisecond)
	return []grpc.DialOption{
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc, MinConnectTimeout: max(refresh/2, 100*time.Millisecond)}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageSize), grpc.MaxCallSendMsgSize(MaxMessageSize)),
	}
}

// Refreshes returns how many refreshes succeeded and failed.
func (c *Client) Refreshes() (ok, failed uint64) { return c.ok.Load(), c.failed.Load() }

// RefreshOnce reports the usage and installs the lease received.
func (c *Client) RefreshOnce(ctx context.Context) error {
	snap := c.usage.Snapshot()
	for i := range snap {
		snap[i].Share = c.leased.Share(snap[i].Customer)
	}
	req := reportToProto(quota.Report{Task: c.task, Customers: snap, NoLease: c.ok.Load() == 0})
	var resp *quotapb.RefreshResponse
	var err error
	if len(c.replicas) == 0 {
		resp, err = c.client.Refresh(ctx, req, grpc.WaitForReady(true))
	} else {
		resp, err = c.refreshReplicas(ctx, req)
	}
	if err != nil {
		c.failed.Add(1)
		return err
	}
	ls, err := leaseFromProto(resp)
	if err == nil {
		err = c.leased.Set(ls)
	}
	if err != nil {
		c.failed.Add(1)
		return fmt.Errorf("quotaservice: lease refused: %w", err)
	}
	c.ok.Add(1)
	return nil
}

// refreshReplicas asks the current replica, then the leader it names or
// else the next one, each at most once (a named leader already asked is
// passed over: a follower's view of the election may lag), until one
// grants a lease.
func (c *Client) refreshReplicas(ctx context.Context, req *quotapb.RefreshRequest) (*quotapb.RefreshResponse, error) {
	n := int64(len(c.replicas))
	var asked uint64 // bit i: replica i asked (at most MaxReplicas)
	i := c.current.Load() % n
	var err error
	for tried := int64(0); tried < n && ctx.Err() == nil; tried++ {
		asked |= 1 << i
		var trailer metadata.MD
		var resp *quotapb.RefreshResponse
		resp, err = c.replicas[i].client.Refresh(ctx, req, grpc.Trailer(&trailer))
		if err == nil {
			c.current.Store(i)
			return resp, nil
		}
		next := (i + 1) % n
		for k := int64(0); k < n && asked&(1<<next) != 0; k++ {
			next = (next + 1) % n
		}
		if hint := trailer.Get(wire.QuotaLeaderKey); len(hint) == 1 {
			j := int64(slices.IndexFunc(c.replicas, func(r replicaConn) bool { return r.addr == hint[0] }))
			if j >= 0 && asked&(1<<j) == 0 {
				next = j
			}
		}
		i = next
		c.current.Store(i)
	}
	if err == nil {
		err = ctx.Err()
	}
	return nil, err
}

// Run refreshes the lease until ctx is done, and returns ctx's error.
func (c *Client) Run(ctx context.Context) error {
	t := c.clock.NewTimer(time.Duration(c.random() * float64(min(c.refresh/4, time.Second))))
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C():
		}
		refresh := c.refresh
		if ls, ok := c.leased.Current(); ok {
			refresh = ls.Refresh
		}
		actx, cancel := context.WithTimeout(ctx, max(refresh/2, 50*time.Millisecond))
		err := c.RefreshOnce(actx)
		cancel()
		var wait time.Duration
		if err == nil {
			failures = 0
			wait = time.Duration(float64(refresh) * (0.75 + 0.5*c.random()))
		} else {
			failures = min(failures+1, 16)
			step := min(refresh, refresh/10<<failures)
			wait = time.Duration(float64(step) * (0.5 + c.random()))
		}
		t.Reset(max(wait, time.Millisecond))
	}
}
