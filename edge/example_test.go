package edge_test

import (
	"fmt"

	"github.com/triagehq/triage/edge"
)

func ExampleClassifier_Classify() {
	c, err := edge.New(edge.Config{
		Default: "CRITICAL",
		Rules: []edge.RuleConfig{
			{Header: true},
			{Host: "*.batch.example.com", Criticality: "SHEDDABLE"},
			{PathPrefix: "/checkout", Criticality: "CRITICAL_PLUS"},
			{Group: "free-tier", Criticality: "SHEDDABLE_PLUS"},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range []edge.Request{
		{Trusted: true, Header: "SHEDDABLE", Path: "/checkout"},
		{Trusted: false, Header: "CRITICAL_PLUS", Host: "uploads.batch.example.com"},
		{Path: "/checkout/pay"},
		{Path: "/", Group: "free-tier"},
		{Path: "/"},
	} {
		d := c.Classify(&r)
		fmt.Println(d.Level, d.Rule)
	}
	// Output:
	// SHEDDABLE header
	// SHEDDABLE host
	// CRITICAL_PLUS path
	// SHEDDABLE_PLUS group
	// CRITICAL default
}
