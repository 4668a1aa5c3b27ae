package intake_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/trust"
)

// The path of one request, as a transport adapter drives it (triagegrpc
// and triagehttp do exactly this; a new transport does too): Accept
// decides what the request is and whether it may come in, Start takes an
// execution slot before the handler runs, Finish gives it back. A caller
// outside the trusted network cannot choose its criticality: its header
// is removed and the rules decide.
func Example() {
	ctl, err := admission.New()
	if err != nil {
		log.Fatal(err)
	}
	rules := edge.MustNew(edge.Config{Rules: []edge.RuleConfig{
		{Header: true}, // a trusted peer's triage-criticality
		{PathPrefix: "/prefetch", Criticality: "SHEDDABLE"},
	}})
	in, err := intake.New(
		intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"10.0.0.0/8"}})),
		intake.WithClassifier(rules),
		intake.WithAdmission(ctl))
	if err != nil {
		log.Fatal(err)
	}
	for _, peer := range []string{"10.1.2.3", "203.0.113.9"} {
		r := &intake.Request{
			Peer:   trust.Peer{Addr: netip.MustParseAddr(peer)},
			Path:   "/prefetch/home",
			Header: map[string][]string{"triage-criticality": {"CRITICAL_PLUS"}},
			Case:   intake.LowerCase,
		}
		h, err := in.Accept(context.Background(), r)
		if err != nil {
			fmt.Println(peer, "refused:", err) // answer it with the transport's form of the outcome
			continue
		}
		if err := h.Start(); err != nil {
			fmt.Println(peer, "refused at start:", err)
			continue
		}
		fmt.Println(peer, criticality.Of(h), "header left:", r.Header["triage-criticality"])
		h.Finish() // after the handler
	}
	// Output:
	// 10.1.2.3 CRITICAL_PLUS header left: [CRITICAL_PLUS]
	// 203.0.113.9 SHEDDABLE header left: []
}
