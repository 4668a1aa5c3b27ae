package app

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/triagehq/triage/internal/testkit/etcdtest"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/testcert"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/quota/grantlog"
	"github.com/triagehq/triage/quota/usage"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
)

func freeTCP(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func scrape(addr string) string {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return string(b)
}

// triage quota-server -etcd: two replicas with the policy in etcd elect
// one leader (their metrics say which, and the policy version), a task
// leases through either, every share goes to the grant log, and a bad
// policy pushed to etcd is refused by both, the last good one kept.
func TestQuotaServerReplicas(t *testing.T) {
	e := etcdtest.Start(t)
	admin := e.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const key = "/triage/test/policy"
	put, err := admin.Put(ctx, key, "tasks: 2\ncustomers:\n  ads: {cpu: 4}\n")
	if err != nil {
		t.Fatal(err)
	}
	rev := put.Header.Revision
	dir := t.TempDir()
	type replica struct {
		addr, metrics, log string
		out, errb          *syncBuffer
		done               chan int
	}
	var rs []*replica
	runCtx, stop := context.WithCancel(context.Background())
	for i := range 2 {
		r := &replica{addr: freeTCP(t), metrics: freeTCP(t), log: filepath.Join(dir, fmt.Sprintf("grants-%d.jsonl", i)), out: &syncBuffer{}, errb: &syncBuffer{}, done: make(chan int, 1)}
		rs = append(rs, r)
		go func() {
			r.done <- run(runCtx, []string{"quota-server", "-etcd", e.Endpoint, "-advertise", r.addr, "-listen", r.addr, "-metrics", r.metrics,
				"-policy-key", key, "-session-ttl", "2s", "-election-prefix", "/triage/test/leader", "-grant-log", r.log, "-lease", "4s", "-refresh", "1s", "-drain", "0s"}, r.out, r.errb)
		}()
	}
	defer func() {
		stop()
		for i, r := range rs {
			if code := <-r.done; code != 0 {
				t.Errorf("replica %d exited %d: %s", i, code, r.errb.String())
			}
		}
	}()
	wait := func(what string, cond func() bool) {
		t.Helper()
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for !cond() {
			select {
			case <-ctx.Done():
				for i, r := range rs {
					t.Logf("replica %d: %s%s", i, r.out.String(), r.errb.String())
				}
				t.Fatalf("%s: not within a minute", what)
			case <-tk.C:
			}
		}
	}
	var leader string
	wait("one leader, known to both", func() bool {
		granting, known := 0, 0
		for _, r := range rs {
			m := scrape(r.metrics)
			if strings.Contains(m, "\ntriage_quota_granting 1\n") {
				granting++
				leader = r.addr
			}
			if leader != "" && strings.Contains(m, fmt.Sprintf("triage_quota_leader{leader=%q} 1", leader)) {
				known++
			}
		}
		return granting == 1 && known == 2
	})
	for i, r := range rs {
		if m := scrape(r.metrics); !strings.Contains(m, fmt.Sprintf("triage_quota_policy_version %d\n", rev)) {
			t.Errorf("replica %d does not report policy version %d:\n%s", i, rev, m)
		}
	}
	conns := map[string]grpc.ClientConnInterface{}
	for _, r := range rs {
		cc, err := grpc.NewClient(r.addr, append(quotaservice.DialOptions(time.Second), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		conns[r.addr] = cc
	}
	u, _ := usage.New()
	leased := quota.NewLeased(nil, nil)
	qc, err := quotaservice.NewClient(nil, "task-0", u, leased, quotaservice.WithReplicas(conns))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		err := qc.RefreshOnce(rctx)
		rcancel()
		if err != nil {
			t.Fatalf("refresh through the replicas: %v", err)
		}
	}
	// A bad push: both refuse it and keep serving the last good policy.
	if _, err := admin.Put(ctx, key, "tasks: 2\ncustomers:\n  ads: {cpu: -1}\n"); err != nil {
		t.Fatal(err)
	}
	wait("both replicas refusing the bad policy", func() bool {
		return strings.Contains(rs[0].errb.String(), "refused") && strings.Contains(rs[1].errb.String(), "refused")
	})
	for i, r := range rs {
		if m := scrape(r.metrics); !strings.Contains(m, fmt.Sprintf("triage_quota_policy_version %d\n", rev)) {
			t.Errorf("replica %d left policy version %d after a bad push", i, rev)
		}
		if !strings.Contains(r.errb.String(), "cpu is negative") {
			t.Errorf("replica %d's refusal does not say why: %s", i, r.errb.String())
		}
	}
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	if err := qc.RefreshOnce(rctx); err != nil {
		t.Fatalf("refresh after the bad push: %v", err)
	}
	// The leader logged its grants: ads, for task-0.
	// It writes them off the refresh path, as soon as they are queued.
	var recs []grantlog.Record
	loopback.WaitFor(t, "the grant log", func() bool {
		recs = nil
		for _, r := range rs {
			f, err := os.Open(r.log)
			if err != nil {
				t.Fatal(err)
			}
			got, err := grantlog.Read(f, 1000)
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, got...)
		}
		return len(recs) >= 3
	})
	if len(recs) != 3 || recs[0].Task != "task-0" || recs[0].Customer != "ads" || recs[0].Replica != leader || recs[0].Lease != 4*time.Second {
		t.Errorf("grant log: %+v; want three grants of ads to task-0 from %s", recs, leader)
	}
	// Its counts are metrics: three records written among the replicas,
	// none dropped or lost. A record is counted once its write has
	// returned, a moment after the file holds it.
	var written int
	var m []string
	loopback.WaitFor(t, "triage_quota_grant_log_records_total to count the logs' records", func() bool {
		written, m = 0, m[:0]
		for _, r := range rs {
			text := scrape(r.metrics)
			m = append(m, text)
			var n int
			if at := strings.Index(text, "\ntriage_quota_grant_log_records_total "); at >= 0 {
				fmt.Sscanf(text[at+1:], "triage_quota_grant_log_records_total %d", &n)
			}
			written += n
		}
		return written >= len(recs)
	})
	for i, text := range m {
		for _, series := range []string{"triage_quota_grant_log_dropped_total 0\n", "triage_quota_grant_log_errors_total 0\n"} {
			if !strings.Contains(text, series) {
				t.Errorf("replica %d's metrics lack %q", i, strings.TrimSpace(series))
			}
		}
		if !strings.Contains(text, "\ntriage_quota_grant_log_records_total ") {
			t.Errorf("replica %d's metrics lack triage_quota_grant_log_records_total", i)
		}
	}
	if written != len(recs) {
		t.Errorf("triage_quota_grant_log_records_total sums to %d over the replicas, the logs hold %d", written, len(recs))
	}
}

// triage quota-server -etcd over TLS: against an etcd that requires
// client certificates, a replica with -etcd-tls-ca, -etcd-tls-cert and
// -etcd-tls-key reads its policy and is elected; one without a client
// certificate cannot read its policy and says so.
func TestQuotaServerEtcdTLS(t *testing.T) {
	t.Parallel() // waits on a refused handshake, and on etcd; no process-wide state
	ca, err := testcert.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pair := func(name string) (string, string) {
		leaf, err := ca.Leaf("spiffe://test/" + name)
		if err != nil {
			t.Fatal(err)
		}
		cert, key, err := testcert.PEM(leaf)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".crt", cert), write(name+".key", key)
	}
	caFile := write("ca.pem", ca.PEM())
	etcdCert, etcdKey := pair("etcd")
	quotaCert, quotaKey := pair("quota")
	e := etcdtest.StartTLS(t, etcdtest.TLS{Cert: etcdCert, Key: etcdKey, CA: caFile, ClientCert: quotaCert, ClientKey: quotaKey})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const key = "/triage/tls/policy"
	if _, err := e.Client(t).Put(ctx, key, "tasks: 2\ncustomers:\n  ads: {cpu: 4}\n"); err != nil {
		t.Fatal(err)
	}
	// Without a client certificate: refused by etcd, the policy unread.
	var out, errb syncBuffer
	addr := freeTCP(t)
	code := run(ctx, []string{"quota-server", "-etcd", e.Endpoint, "-advertise", addr, "-listen", addr, "-policy-key", key, "-etcd-tls-ca", caFile}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "reading policy") {
		t.Fatalf("without a client certificate: exit %d, stderr %q; want 1, the policy unread", code, errb.String())
	}
	// With one: elected.
	addr, metrics := freeTCP(t), freeTCP(t)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan int, 1)
	var out2, errb2 syncBuffer
	go func() {
		done <- run(runCtx, []string{"quota-server", "-etcd", e.Endpoint, "-advertise", addr, "-listen", addr, "-metrics", metrics, "-policy-key", key,
			"-etcd-tls-ca", caFile, "-etcd-tls-cert", quotaCert, "-etcd-tls-key", quotaKey, "-session-ttl", "2s", "-drain", "0s"}, &out2, &errb2)
	}()
	tk := time.NewTicker(20 * time.Millisecond)
	defer tk.Stop()
	for !strings.Contains(scrape(metrics), "\ntriage_quota_granting 1\n") {
		select {
		case <-ctx.Done():
			t.Fatalf("not elected over TLS within a minute: %s%s", out2.String(), errb2.String())
		case <-tk.C:
		}
	}
	stop()
	if code := <-done; code != 0 {
		t.Errorf("exit %d: %s", code, errb2.String())
	}
}
