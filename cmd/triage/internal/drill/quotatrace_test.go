package drill

import (
	"context"
	"testing"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/outcome"
)

// A refusal of the intake's quota is among the task's refusals, by
// criticality, customer and task; the intake's other refusals are the
// admission Observer's to tell.
func TestQuotaRefusalsAreTheTasks(t *testing.T) {
	tk := &task{cfg: Task{ID: "db-0"}, rejected: map[string]int64{}}
	tr := quotaTrace{tk}
	tr.Trace(context.Background(), &intake.Event{Kind: intake.Refused, Level: criticality.Sheddable, Customer: "gmail",
		Err: &outcome.Error{Kind: outcome.OutOfQuota, Reason: "customer over quota"}})
	tr.Trace(context.Background(), &intake.Event{Kind: intake.Refused, Level: criticality.Sheddable, Customer: "gmail",
		Err: &outcome.Error{Kind: outcome.TaskOverloaded, Reason: "concurrency"}})
	tr.Trace(context.Background(), &intake.Event{Kind: intake.Admitted, Level: criticality.Critical, Customer: "gmail"})
	if len(tk.rejected) != 1 || tk.rejected["out-of-quota SHEDDABLE gmail on db-0"] != 1 {
		t.Fatalf("refusals %v, want the one out-of-quota SHEDDABLE gmail on db-0", tk.rejected)
	}
}
