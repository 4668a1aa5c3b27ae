package triagehttp

import (
	"net/http"
	"testing"

	"github.com/triagehq/triage/wire"
)

func TestHeaderNames(t *testing.T) {
	for key, canon := range map[string]string{
		wire.CriticalityKey: criticalityHeader,
		wire.DecayKey:       decayHeader,
		wire.AttemptKey:     attemptHeader,
		wire.OutcomeKey:     outcomeHeader,
	} {
		if http.CanonicalHeaderKey(key) != canon {
			t.Errorf("%q: constant %q, canonical %q", key, canon, http.CanonicalHeaderKey(key))
		}
	}
}
