// Package deploy holds what operators load next to triage's metrics: the
// CRE post's "throttling as a signal". prometheus/triage-rules.yml has
// recording rules (the throttled share per criticality and per customer,
// the retry rate, the attempt histogram of SRE book Figure 21-1) and
// alerts: a page when CRITICAL or CRITICAL_PLUS traffic
// is throttled, and a quiet ticket when sheddable traffic has been
// throttled for more than 12 of the last 24 hours ("retryable throttling
// for a few minutes is fine; 12 hours a day is a capacity problem").
// grafana/triage-dashboard.json is a Grafana dashboard over the same
// series.
//
// The package has no code; its tests check the files: `promtool check
// rules` and `promtool test rules` (Debian's prometheus package; CI
// installs it), every series the rules and the dashboard read is one
// triageprom exports or a rule records, and the dashboard passes a
// structural schema check with its queries parsed by promtool.
package deploy
