package quotaservice

import (
	"math"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotapb"
)

// FuzzLease decodes arbitrary bytes as the quota service's answer, as a
// task does (quotapb, leaseFromProto, quota.Leased.Set): a malformed or
// invalid lease is refused, never a panic; a lease that is installed
// gives every customer and level a limit that is a number >= 0, before
// and after it expires.
func FuzzLease(f *testing.F) {
	for _, ls := range []quota.Lease{
		{Duration: 30 * time.Second, Refresh: 5 * time.Second, Fallback: quota.Safe, Tasks: 3,
			Default: quota.Grant{CPU: 0.5, Share: 0.3}, Grants: []quota.Grant{{Customer: "gmail", CPU: 4000, Share: 0.5, ByCriticality: [4]float64{100}}}},
		{Duration: time.Second, Refresh: time.Second, Fallback: quota.Pessimistic, Tasks: 1, Partial: true, Default: quota.Grant{CPU: 1, Share: 1, Hard: true}},
	} {
		f.Add(leaseToProto(ls).Marshal())
	}
	f.Add([]byte{0x18, 0x01, 0x20, 0x01, 0x2a, 0x04, 's', 'a', 'f', 'e', 0x30, 0x01})
	f.Add([]byte{0x0a, 0x00, 0x12, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		var resp quotapb.RefreshResponse
		if resp.Unmarshal(b) != nil {
			return
		}
		ls, err := leaseFromProto(&resp)
		if err != nil {
			return
		}
		clk := clock.NewFake(time.Unix(0, 0))
		boot, _ := quota.New(quota.Config{Tasks: 2, Customers: map[string]quota.Limit{"gmail": {CPU: 2}}})
		l := quota.NewLeased(clk, boot)
		if err := l.Set(ls); err != nil {
			t.Fatalf("leaseFromProto accepted a lease Leased refuses: %v", err)
		}
		for _, when := range []time.Duration{0, ls.Duration + time.Second} {
			clk.Advance(when)
			for _, c := range append([]string{"gmail", "stranger", quota.Other}, customersOf(ls)...) {
				for lv := range criticality.Level(criticality.NumLevels) {
					if v, _ := l.Limit(c, lv); math.IsNaN(v) || v < 0 {
						t.Fatalf("limit of %q at %v: %v", c, lv, v)
					}
				}
			}
		}
	})
}

func customersOf(ls quota.Lease) []string {
	var out []string
	for _, g := range ls.Grants {
		out = append(out, g.Customer)
	}
	return out
}
