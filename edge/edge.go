// Package edge assigns a criticality to each request entering the system.
//
// SRE book ch. 21, "Criticality": "Our practice is thus to set the
// criticality as close as possible to the browsers or mobile
// clients—typically in the HTTP frontends that produce the HTML to be
// returned—and only override the criticality in specific cases where it makes
// sense". The CRE post ("Setting criticality") lists how: by an explicit
// request header, by hostname (each client type on its own hostname), by URL
// path, by user group. A Classifier evaluates such rules in the order
// configured; the first that matches decides, else the default.
//
// The header rule believes the triage-criticality header only from trusted
// peers (package trust); for every other peer the header is ignored here and
// stripped by the adapters, and the remaining rules decide. The same
// Classifier serves internal hops: with just the header rule it propagates
// what a trusted upstream set.
//
// This package imports only the standard library; the HTTP and gRPC
// adapters fill a Request from their transport and triageyaml loads a Config
// from YAML.
package edge

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/hostport"
)

// RuleKind names what a rule matches on. It is also the "rule" label of
// triage's metrics.
type RuleKind uint8

const (
	// Default is the decision when no rule matched.
	Default RuleKind = iota
	// Header believes the triage-criticality header of a trusted peer.
	Header
	// Host matches the request's host name.
	Host
	// PathPrefix matches the request's path (or gRPC full method).
	PathPrefix
	// Group matches the user group an application-supplied function
	// assigns to the request.
	Group
)

var kindNames = [...]string{"default", "header", "host", "path", "group"}

func (k RuleKind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// MaxRules bounds the number of rules a Config may hold.
const MaxRules = 1024

// Config is the serializable form of a Classifier's rules.
type Config struct {
	// Default is the criticality when no rule matches, as a canonical name.
	// Empty means CRITICAL, the book's default.
	Default string `yaml:"default" json:"default"`
	// Rules are evaluated in order; the first match decides. At most
	// MaxRules. Empty means no rule: every request gets Default.
	Rules []RuleConfig `yaml:"rules" json:"rules"`
}

// RuleConfig is one rule. Exactly one of Header, Host, PathPrefix and Group
// must be set; all but Header need Criticality.
type RuleConfig struct {
	// Header, when true, believes the triage-criticality header sent by a
	// trusted peer. A malformed header falls through to the next rule.
	Header bool `yaml:"header,omitempty" json:"header,omitempty"`
	// Host matches the request host, case-insensitively, port ignored:
	// "api.example.com" exactly, or "*.example.com" for any subdomain
	// (not example.com itself).
	Host string `yaml:"host,omitempty" json:"host,omitempty"`
	// PathPrefix matches whole path segments: "/api" matches "/api" and
	// "/api/x", not "/apix". A prefix ending in "/" matches any path under it.
	PathPrefix string `yaml:"path_prefix,omitempty" json:"path_prefix,omitempty"`
	// Group matches the user group returned by the application's group
	// function (exact, case-sensitive).
	Group string `yaml:"group,omitempty" json:"group,omitempty"`
	// Criticality is the canonical name assigned on a match.
	Criticality string `yaml:"criticality,omitempty" json:"criticality,omitempty"`
	// Decay, optional, says how the value of a matching request falls
	// while it waits (not on header rules: a trusted upstream sends its
	// own decay on the wire).
	Decay *DecayConfig `yaml:"decay,omitempty" json:"decay,omitempty"`
}

// DecayConfig is the CRE post's "Criticality changes over time": the
// front page is worth CRITICAL for 2 s after the request arrives and then
// nothing ({after: 2s, to: cancel}), or only what a SHEDDABLE request is
// worth ({after: 2s, to: SHEDDABLE}).
type DecayConfig struct {
	// After is a Go duration ("2s", "1500ms"), more than 0 and at most
	// criticality.MaxDecay, counted from the request's arrival at the edge.
	After string `yaml:"after" json:"after"`
	// To is a canonical level below the rule's criticality, or "cancel":
	// the request's deadline is then After.
	To string `yaml:"to" json:"to"`
}

// Decay is a compiled DecayConfig; the zero value is no decay.
type Decay struct {
	After  time.Duration
	To     criticality.Level
	Cancel bool
}

// HeaderOnly is the Config of an internal hop: believe a trusted upstream's
// header, else CRITICAL.
func HeaderOnly() Config { return Config{Rules: []RuleConfig{{Header: true}}} }

type rule struct {
	kind  RuleKind
	host  string // lower case; wildcard suffix starts with "."
	wild  bool
	path  string
	group string
	level criticality.Level
	decay Decay
}

// Classifier assigns criticality by ordered rules. It is immutable after New
// and safe for concurrent use; its size is bounded by MaxRules. Classify does
// not allocate.
type Classifier struct {
	set atomic.Pointer[ruleSet]
	obs Observer
}

// ruleSet is one configuration of a Classifier.
type ruleSet struct {
	rules      []rule
	def        criticality.Level
	needsGroup bool
}

// Option configures a Classifier.
type Option interface{ apply(*Classifier) }

type optionFunc func(*Classifier)

func (f optionFunc) apply(c *Classifier) { f(c) }

// WithObserver reports every decision to o. Default: no-op.
func WithObserver(o Observer) Option {
	return optionFunc(func(c *Classifier) {
		if o != nil {
			c.obs = o
		}
	})
}

// ErrConfig is wrapped by every error New returns.
var ErrConfig = errors.New("edge: invalid config")

// New validates c and builds a Classifier.
func New(c Config, opts ...Option) (*Classifier, error) {
	cl := &Classifier{obs: Nop{}}
	for _, o := range opts {
		o.apply(cl)
	}
	if err := cl.Update(c); err != nil {
		return nil, err
	}
	return cl, nil
}

// Update replaces cl's rules and default with c's, at once for every later
// Classify, or returns New's error and keeps what cl had. The observer
// stays.
func (cl *Classifier) Update(c Config) error {
	rs := &ruleSet{def: criticality.Default}
	if c.Default != "" {
		l, err := criticality.Parse(c.Default)
		if err != nil {
			return fmt.Errorf("%w: default: %v", ErrConfig, err)
		}
		rs.def = l
	}
	if len(c.Rules) > MaxRules {
		return fmt.Errorf("%w: %d rules, at most %d", ErrConfig, len(c.Rules), MaxRules)
	}
	for i, rc := range c.Rules {
		r, err := compile(rc)
		if err != nil {
			return fmt.Errorf("%w: rule %d: %v", ErrConfig, i+1, err)
		}
		if r.kind == Group {
			rs.needsGroup = true
		}
		rs.rules = append(rs.rules, r)
	}
	cl.set.Store(rs)
	return nil
}

func compile(rc RuleConfig) (rule, error) {
	set := 0
	var r rule
	if rc.Header {
		set++
		r.kind = Header
	}
	if rc.Host != "" {
		set++
		r.kind = Host
		h := strings.ToLower(rc.Host)
		if strings.HasPrefix(h, "*.") {
			r.wild, h = true, h[1:]
		}
		if strings.ContainsAny(h, "*/: ") || h == "" || h == "." {
			return r, fmt.Errorf("host %q: want a host name or *.domain", rc.Host)
		}
		r.host = h
	}
	if rc.PathPrefix != "" {
		set++
		r.kind = PathPrefix
		if !strings.HasPrefix(rc.PathPrefix, "/") {
			return r, fmt.Errorf("path_prefix %q must start with /", rc.PathPrefix)
		}
		r.path = rc.PathPrefix
	}
	if rc.Group != "" {
		set++
		r.kind = Group
		r.group = rc.Group
	}
	if set != 1 {
		return r, fmt.Errorf("set exactly one of header, host, path_prefix, group (got %d)", set)
	}
	if r.kind == Header {
		if rc.Decay != nil {
			return r, fmt.Errorf("a header rule takes its decay from the wire; remove decay")
		}
		if rc.Criticality != "" {
			return r, fmt.Errorf("a header rule takes its criticality from the header; remove criticality %q", rc.Criticality)
		}
		return r, nil
	}
	if rc.Criticality == "" {
		return r, fmt.Errorf("criticality is required")
	}
	l, err := criticality.Parse(rc.Criticality)
	if err != nil {
		return r, err
	}
	r.level = l
	if rc.Decay != nil {
		if r.decay, err = compileDecay(*rc.Decay, l); err != nil {
			return r, err
		}
	}
	return r, nil
}

func compileDecay(dc DecayConfig, l criticality.Level) (Decay, error) {
	after, err := time.ParseDuration(dc.After)
	if err != nil || after <= 0 || after > criticality.MaxDecay {
		return Decay{}, fmt.Errorf("decay: after %q: want a duration in (0, %v]", dc.After, criticality.MaxDecay)
	}
	if dc.To == "cancel" {
		return Decay{After: after, Cancel: true}, nil
	}
	to, err := criticality.Parse(dc.To)
	if err != nil {
		return Decay{}, fmt.Errorf("decay: to %q: want a level below %v, or cancel", dc.To, l)
	}
	if to >= l {
		return Decay{}, fmt.Errorf("decay: to %v is not below the rule's %v", to, l)
	}
	return Decay{After: after, To: to}, nil
}

// MustNew is New for literal configurations; it panics on error and must not
// be used with user input.
func MustNew(c Config, opts ...Option) *Classifier {
	cl, err := New(c, opts...)
	if err != nil {
		panic(err)
	}
	return cl
}

// Request is what a Classifier looks at. Adapters fill it from the
// transport.
type Request struct {
	// Trusted says whether the peer is trusted (package trust). The header
	// rule ignores Header unless it is.
	Trusted bool
	// Header is the raw triage-criticality value, "" if absent.
	Header string
	// Host is the request host (HTTP Host or gRPC :authority), port allowed.
	Host string
	// Path is the URL path, or the gRPC full method ("/pkg.Svc/Method").
	Path string
	// Group is the user group; adapters fill it only if NeedsGroup.
	Group string
}

// Decision is the outcome of Classify.
type Decision struct {
	// Level is the assigned criticality.
	Level criticality.Level
	// Rule is the kind of rule that decided (Default if none matched).
	Rule RuleKind
	// Trusted echoes Request.Trusted.
	Trusted bool
	// InvalidHeader is true when a trusted peer sent a malformed header,
	// which was ignored.
	InvalidHeader bool
	// Decay is the matching rule's decay (zero: none). The adapter starts
	// it at the request's arrival (criticality.WithDecay, or a deadline
	// for Cancel).
	Decay Decay
}

// NeedsGroup reports whether some rule matches on Group, so adapters know
// whether to compute it.
func (c *Classifier) NeedsGroup() bool { return c.rules().needsGroup }

// rules returns c's configuration in force.
func (c *Classifier) rules() *ruleSet { return c.set.Load() }

// Classify evaluates the rules against r and reports the decision to the
// observer. It does not allocate.
func (c *Classifier) Classify(r *Request) Decision {
	d := c.classify(r)
	c.obs.Classified(d)
	return d
}

func (c *Classifier) classify(r *Request) Decision {
	rs := c.rules()
	d := Decision{Level: rs.def, Rule: Default, Trusted: r.Trusted}
	p, cleaned := r.Path, false
	for i := range rs.rules {
		ru := &rs.rules[i]
		switch ru.kind {
		case Header:
			if !r.Trusted || r.Header == "" {
				continue
			}
			l, err := criticality.Parse(r.Header)
			if err != nil {
				d.InvalidHeader = true
				continue
			}
			d.Level, d.Rule = l, Header
			return d
		case Host:
			if !hostMatch(ru, r.Host) {
				continue
			}
		case PathPrefix:
			if !cleaned {
				p, cleaned = cleanPath(p), true
			}
			if !pathMatch(ru.path, p) {
				continue
			}
		case Group:
			if r.Group != ru.group {
				continue
			}
		}
		d.Level, d.Rule, d.Decay = ru.level, ru.kind, ru.decay
		return d
	}
	return d
}

func hostMatch(ru *rule, host string) bool {
	host = hostport.Host(host)
	if ru.wild {
		return len(host) > len(ru.host) && strings.EqualFold(host[len(host)-len(ru.host):], ru.host)
	}
	return strings.EqualFold(host, ru.host)
}

// cleanPath is the path an application will route: "." and ".."
// segments resolved and repeated slashes folded (path.Clean), so that
// "/checkout/../admin" is not under "/checkout". It allocates only for a
// path that needs cleaning.
func cleanPath(p string) string {
	if !strings.Contains(p, "//") && !strings.Contains(p, "/.") {
		return p
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

func pathMatch(prefix, path string) bool {
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	if len(path) == len(prefix) || strings.HasSuffix(prefix, "/") {
		return true
	}
	return path[len(prefix)] == '/'
}

// Observer receives the edge's decisions. Implementations must be safe for
// concurrent use and cheap: they run on every request. The Prometheus adapter
// (triageprom) implements it.
type Observer interface {
	// Classified reports one decision.
	Classified(d Decision)
	// Stripped reports that a triage key sent by an untrusted peer, or
	// one spelled with an underscore by any peer (wire.Folded), was
	// removed. key is the registered key name, or "unregistered" for any
	// other key with the triage- or triage_ prefix (never the raw name: it
	// is attacker-chosen).
	Stripped(key string)
}

// Nop is an Observer that does nothing; it is the default.
type Nop struct{}

func (Nop) Classified(Decision) {}
func (Nop) Stripped(string)     {}

// Observer returns the classifier's observer, so adapters report stripped
// keys to the same place.
func (c *Classifier) Observer() Observer { return c.obs }

// Tee returns an Observer that tells each of obs, nil ones skipped: to
// report to two exporters at once (triageprom and triageotel while
// moving from one to the other).
func Tee(obs ...Observer) Observer {
	var out tee
	for _, o := range obs {
		if o != nil {
			out = append(out, o)
		}
	}
	return out
}

type tee []Observer

func (t tee) Classified(d Decision) {
	for _, o := range t {
		o.Classified(d)
	}
}

func (t tee) Stripped(key string) {
	for _, o := range t {
		o.Stripped(key)
	}
}
