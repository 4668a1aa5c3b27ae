package edge_test

import (
	"errors"
	"testing"
	"time"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
)

func frontendRules() edge.Config {
	return edge.Config{
		Default: "SHEDDABLE_PLUS",
		Rules: []edge.RuleConfig{
			{Header: true},
			{Host: "batch.example.com", Criticality: "SHEDDABLE"},
			{Host: "*.internal.example.com", Criticality: "CRITICAL"},
			{PathPrefix: "/checkout", Criticality: "CRITICAL_PLUS"},
			{PathPrefix: "/static/", Criticality: "SHEDDABLE"},
			{Group: "premium", Criticality: "CRITICAL"},
		},
	}
}

func TestClassify(t *testing.T) {
	c := edge.MustNew(frontendRules())
	tests := []struct {
		name      string
		req       edge.Request
		want      criticality.Level
		rule      edge.RuleKind
		invalidHd bool
	}{
		{"trusted header wins", edge.Request{Trusted: true, Header: "CRITICAL_PLUS", Host: "batch.example.com"}, criticality.CriticalPlus, edge.Header, false},
		{"untrusted header ignored", edge.Request{Header: "CRITICAL_PLUS", Host: "batch.example.com"}, criticality.Sheddable, edge.Host, false},
		{"untrusted header ignored, default", edge.Request{Header: "CRITICAL_PLUS", Path: "/"}, criticality.SheddablePlus, edge.Default, false},
		{"malformed trusted header falls through", edge.Request{Trusted: true, Header: "critical_plus", Path: "/checkout/pay"}, criticality.CriticalPlus, edge.PathPrefix, true},
		{"host with port and case", edge.Request{Host: "BATCH.example.com:8443"}, criticality.Sheddable, edge.Host, false},
		{"host trailing dot", edge.Request{Host: "batch.example.com."}, criticality.Sheddable, edge.Host, false},
		{"wildcard host", edge.Request{Host: "a.b.internal.example.com"}, criticality.Critical, edge.Host, false},
		{"wildcard excludes apex", edge.Request{Host: "internal.example.com"}, criticality.SheddablePlus, edge.Default, false},
		{"ipv6 host", edge.Request{Host: "[::1]:80"}, criticality.SheddablePlus, edge.Default, false},
		{"path exact", edge.Request{Path: "/checkout"}, criticality.CriticalPlus, edge.PathPrefix, false},
		{"path segment", edge.Request{Path: "/checkoutx"}, criticality.SheddablePlus, edge.Default, false},
		{"path slash prefix", edge.Request{Path: "/static/x.css"}, criticality.Sheddable, edge.PathPrefix, false},
		{"group", edge.Request{Group: "premium", Path: "/"}, criticality.Critical, edge.Group, false},
		{"order matters: host before path", edge.Request{Host: "batch.example.com", Path: "/checkout"}, criticality.Sheddable, edge.Host, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := c.Classify(&tt.req)
			if d.Level != tt.want || d.Rule != tt.rule || d.InvalidHeader != tt.invalidHd || d.Trusted != tt.req.Trusted {
				t.Fatalf("Classify = %+v; want level %v rule %v invalid %v", d, tt.want, tt.rule, tt.invalidHd)
			}
		})
	}
	if !c.NeedsGroup() {
		t.Error("NeedsGroup() = false with a group rule")
	}
}

func TestHeaderOnlyAndEmpty(t *testing.T) {
	c := edge.MustNew(edge.HeaderOnly())
	if d := c.Classify(&edge.Request{Trusted: true, Header: "SHEDDABLE"}); d.Level != criticality.Sheddable {
		t.Errorf("trusted header: %v", d.Level)
	}
	if d := c.Classify(&edge.Request{Header: "SHEDDABLE"}); d.Level != criticality.Critical || d.Rule != edge.Default {
		t.Errorf("untrusted header: %+v", d)
	}
	if c.NeedsGroup() {
		t.Error("NeedsGroup with no group rule")
	}
	if d := edge.MustNew(edge.Config{}).Classify(&edge.Request{Trusted: true, Header: "SHEDDABLE"}); d.Level != criticality.Default {
		t.Errorf("no rules: header believed: %+v", d)
	}
}

func TestConfigErrors(t *testing.T) {
	bad := []edge.Config{
		{Default: "critical"},
		{Rules: []edge.RuleConfig{{}}},
		{Rules: []edge.RuleConfig{{Header: true, Host: "a", Criticality: "CRITICAL"}}},
		{Rules: []edge.RuleConfig{{Header: true, Criticality: "CRITICAL"}}},
		{Rules: []edge.RuleConfig{{Host: "a.com"}}},
		{Rules: []edge.RuleConfig{{Host: "a.com", Criticality: "HIGH"}}},
		{Rules: []edge.RuleConfig{{Host: "a*.com", Criticality: "CRITICAL"}}},
		{Rules: []edge.RuleConfig{{Host: "a.com:80", Criticality: "CRITICAL"}}},
		{Rules: []edge.RuleConfig{{PathPrefix: "api", Criticality: "CRITICAL"}}},
		{Rules: make([]edge.RuleConfig, edge.MaxRules+1)},
	}
	for i, c := range bad {
		if _, err := edge.New(c); !errors.Is(err, edge.ErrConfig) {
			t.Errorf("config %d: err = %v, want ErrConfig", i, err)
		}
	}
}

type recorder struct {
	decisions []edge.Decision
}

func (r *recorder) Classified(d edge.Decision) { r.decisions = append(r.decisions, d) }
func (r *recorder) Stripped(string)            {}

func TestObserverSeesEveryDecision(t *testing.T) {
	rec := &recorder{}
	c := edge.MustNew(frontendRules(), edge.WithObserver(rec))
	c.Classify(&edge.Request{Path: "/checkout"})
	c.Classify(&edge.Request{Trusted: true, Header: "SHEDDABLE"})
	if len(rec.decisions) != 2 || rec.decisions[0].Rule != edge.PathPrefix || rec.decisions[1].Rule != edge.Header {
		t.Fatalf("observer saw %+v", rec.decisions)
	}
	if c.Observer() != edge.Observer(rec) {
		t.Fatal("Observer() does not return the configured observer")
	}
}

func BenchmarkClassify(b *testing.B) {
	c := edge.MustNew(frontendRules())
	req := &edge.Request{Host: "www.example.com:443", Path: "/checkout/pay"}
	b.ReportAllocs()
	for b.Loop() {
		c.Classify(req)
	}
}

func TestDecayRules(t *testing.T) {
	c, err := edge.New(edge.Config{Rules: []edge.RuleConfig{
		{PathPrefix: "/home", Criticality: "CRITICAL_PLUS", Decay: &edge.DecayConfig{After: "2s", To: "SHEDDABLE"}},
		{PathPrefix: "/cart", Criticality: "CRITICAL", Decay: &edge.DecayConfig{After: "1500ms", To: "cancel"}},
		{PathPrefix: "/about", Criticality: "CRITICAL"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]edge.Decay{
		"/home":  {After: 2 * time.Second, To: criticality.Sheddable},
		"/cart":  {After: 1500 * time.Millisecond, Cancel: true},
		"/about": {},
	} {
		if d := c.Classify(&edge.Request{Path: path}); d.Decay != want {
			t.Errorf("%s: decay %+v, want %+v", path, d.Decay, want)
		}
	}
	for _, rc := range []edge.RuleConfig{
		{PathPrefix: "/a", Criticality: "CRITICAL", Decay: &edge.DecayConfig{After: "2s", To: "CRITICAL"}},   // not below
		{PathPrefix: "/a", Criticality: "SHEDDABLE", Decay: &edge.DecayConfig{After: "2s", To: "SHEDDABLE"}}, // not below
		{PathPrefix: "/a", Criticality: "CRITICAL", Decay: &edge.DecayConfig{After: "0s", To: "SHEDDABLE"}},  // zero
		{PathPrefix: "/a", Criticality: "CRITICAL", Decay: &edge.DecayConfig{After: "-1s", To: "SHEDDABLE"}}, // negative
		{PathPrefix: "/a", Criticality: "CRITICAL", Decay: &edge.DecayConfig{After: "2h", To: "SHEDDABLE"}},  // too long
		{PathPrefix: "/a", Criticality: "CRITICAL", Decay: &edge.DecayConfig{After: "2", To: "SHEDDABLE"}},   // no unit
		{PathPrefix: "/a", Criticality: "CRITICAL", Decay: &edge.DecayConfig{After: "2s", To: "sheddable"}},  // not canonical
		{PathPrefix: "/a", Criticality: "CRITICAL", Decay: &edge.DecayConfig{After: "2s"}},                   // no target
		{Header: true, Decay: &edge.DecayConfig{After: "2s", To: "SHEDDABLE"}},                               // header rule
	} {
		if _, err := edge.New(edge.Config{Rules: []edge.RuleConfig{rc}}); !errors.Is(err, edge.ErrConfig) {
			t.Errorf("rule %+v decay %+v: err %v, want ErrConfig", rc, *rc.Decay, err)
		} else {
			t.Log(err)
		}
	}
}

// Path rules match the path the application will route (issue 21, item
// 10): "/checkout/../x" is "/x", not under "/checkout", and "//checkout"
// or "/./checkout" are "/checkout". Host rules read a host with a port and
// a trailing dot as the host: "pay.example.com.:443" is "pay.example.com".
func TestRulesMatchCleanedPathsAndHosts(t *testing.T) {
	c := edge.MustNew(edge.Config{Default: "SHEDDABLE", Rules: []edge.RuleConfig{
		{PathPrefix: "/checkout", Criticality: "CRITICAL_PLUS"},
		{Host: "pay.example.com", Criticality: "CRITICAL"},
	}})
	for _, tc := range []struct {
		host, path string
		want       criticality.Level
	}{
		{"", "/checkout/../admin", criticality.Sheddable},
		{"", "/checkout/%2e%2e/admin", criticality.CriticalPlus}, // not decoded here: a literal segment under /checkout
		{"", "//checkout/x", criticality.CriticalPlus},
		{"", "/./checkout", criticality.CriticalPlus},
		{"", "/x/../checkout/y", criticality.CriticalPlus},
		{"", "/checkout", criticality.CriticalPlus},
		{"pay.example.com.:443", "/", criticality.Critical},
		{"PAY.example.com.", "/", criticality.Critical},
		{"[::1]:443", "/", criticality.Sheddable},
	} {
		if d := c.Classify(&edge.Request{Host: tc.host, Path: tc.path}); d.Level != tc.want {
			t.Errorf("host %q path %q: %v, want %v", tc.host, tc.path, d.Level, tc.want)
		}
	}
}
