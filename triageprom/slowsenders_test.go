package triageprom_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/triagehq/triage/triageprom"
)

type refusals uint64

func (r *refusals) SlowSenderRefusals() uint64 { return uint64(*r) }

// The collector reads the server's count at every scrape.
func TestSlowSendersCounter(t *testing.T) {
	n := refusals(3)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(triageprom.SlowSenders(&n))
	want := `# HELP triage_slow_sender_refusals_total Streams refused at arrival because their connection sent messages past the message timeout (a slow sender's penalty or probation).
# TYPE triage_slow_sender_refusals_total counter
triage_slow_sender_refusals_total %d
`
	for _, v := range []refusals{3, 250} {
		n = v
		if err := testutil.GatherAndCompare(reg, strings.NewReader(strings.Replace(want, "%d", strconv.FormatUint(uint64(v), 10), 1)), "triage_slow_sender_refusals_total"); err != nil {
			t.Fatal(err)
		}
	}
}
