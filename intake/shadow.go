package intake

import (
	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/shadow"
)

// WithShadow puts the mechanisms of s in shadow (package shadow): each
// decides as it would, tells o (nil: shadow.Nop) what it would have
// refused, and refuses nothing. A request one of them would have refused
// goes on as if that mechanism had not seen it: admission's (no execution
// slot), quota's (no reservation, no charge), the black hole's, the
// connection penalty's (not paced). A request admission would have made
// wait for a slot runs at once, without one. Default: none.
func WithShadow(s shadow.Set, o shadow.Observer) Option {
	return optionFunc(func(in *Intake) {
		in.shadow = s
		in.shadowObs = o
		if o == nil {
			in.shadowObs = shadow.Nop{}
		}
	})
}

// shadows reports whether m is in shadow, and if so tells the observer
// about the refusal it would have made, unless a mechanism before it in
// shadow already would have (*done): one refusal per request, as under
// enforcement.
func (in *Intake) shadows(m shadow.Mechanism, reason string, l criticality.Level, done *bool) bool {
	if !in.shadow.Has(m) {
		return false
	}
	if !*done {
		in.shadowObs.WouldRefuse(m, reason, l)
		*done = true
	}
	return true
}

// skips reports whether a request that a mechanism in shadow would have
// refused (done) skips m, also in shadow: under enforcement m would never
// have seen it. Mechanisms that enforce see every request.
func (in *Intake) skips(m shadow.Mechanism, done bool) bool { return done && in.shadow.Has(m) }

// shadowsAdmission is shadows for an admission rejection err.
func (in *Intake) shadowsAdmission(err error, l criticality.Level, done *bool) bool {
	r, _, ok := admission.RejectionOf(err)
	return ok && in.shadows(shadow.Admission, r.String(), l, done)
}
