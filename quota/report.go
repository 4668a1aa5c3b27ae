package quota

import (
	"fmt"
	"math"

	"github.com/triagehq/triage/quota/usage"
)

// Report is what a task tells the quota service: its id and each
// customer's usage and demand on it (usage.Table.Snapshot), and whether it holds
// no lease yet (its process received none since it started).
type Report struct {
	Task      string
	Customers []usage.Customer
	NoLease   bool
}

// MaxReportCustomers bounds the customers in one Report: what a usage.Table can
// track, plus Other.
const MaxReportCustomers = MaxCustomers + 1

// Validate checks a report as received from the wire: a valid task name,
// at most MaxReportCustomers customers, each named once with a valid name
// (or Other), usage and demand finite, non-negative and at most MaxLimit.
func (r Report) Validate() error {
	if err := validName(r.Task); err != nil {
		return fmt.Errorf("quota: report task: %v", err)
	}
	if len(r.Customers) > MaxReportCustomers {
		return fmt.Errorf("quota: report has %d customers, at most %d", len(r.Customers), MaxReportCustomers)
	}
	seen := make(map[string]struct{}, len(r.Customers))
	for _, c := range r.Customers {
		if c.Customer != Other {
			if err := validName(c.Customer); err != nil {
				return fmt.Errorf("quota: report customer %q: %v", c.Customer, err)
			}
		}
		if _, dup := seen[c.Customer]; dup {
			return fmt.Errorf("quota: report names customer %q twice", c.Customer)
		}
		seen[c.Customer] = struct{}{}
		if math.IsNaN(c.Share) || c.Share < 0 || c.Share > 1 {
			return fmt.Errorf("quota: report customer %q: share %v out of [0, 1]", c.Customer, c.Share)
		}
		if err := validLimit(c.Demand); err != nil {
			return fmt.Errorf("quota: report customer %q: demand %v", c.Customer, err)
		}
		for _, v := range c.Used {
			if err := validLimit(v); err != nil {
				return fmt.Errorf("quota: report customer %q: usage %v", c.Customer, err)
			}
		}
	}
	return nil
}
