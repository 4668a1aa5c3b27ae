package lb

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/grpc/serviceconfig"

	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/subset"
)

// Config is the JSON configuration of the "triage" balancer. Zero
// fields take the defaults of package balance and subset.
type Config struct {
	serviceconfig.LoadBalancingConfig `json:"-"`

	// Policy: round_robin (default), least_loaded or weighted_round_robin.
	Policy string `json:"policy,omitempty"`
	// SubsetSize is how many of the resolved backends this client
	// connects to (default subset.DefaultSize, 20; -1 means all).
	SubsetSize int `json:"subsetSize,omitempty"`
	// SubsetAlgorithm: deterministic (default), random or ringsteady.
	SubsetAlgorithm string `json:"subsetAlgorithm,omitempty"`
	// ClientID is this client task's index among the clients of the
	// service (the book's client_id). Without it, each balancer takes a
	// random one: subsets then spread like random subsetting's.
	ClientID *int `json:"clientId,omitempty"`
	// ReplaceAfter is how long a subset member must be failing (its
	// connection down or failing to connect) before a replacement joins
	// the subset, until it serves again ("1s" by default, at most 1m). A
	// member that says it is not serving, by its health check turning
	// NOT_SERVING while connected or by the triage-lame-duck trailer, is
	// replaced at once.
	ReplaceAfter string `json:"replaceAfter,omitempty"`
	// MaxActive is the flow-control cap per backend (default 100; -1
	// disables it).
	MaxActive int `json:"maxActive,omitempty"`
	// ErrorWindow, WeightPeriod, Blackout and Expiry are durations ("1s").
	ErrorWindow  string `json:"errorWindow,omitempty"`
	WeightPeriod string `json:"weightPeriod,omitempty"`
	Blackout     string `json:"blackout,omitempty"`
	Expiry       string `json:"expiry,omitempty"`
	// ErrorPenalty is the weighted round robin error penalty (default 1).
	ErrorPenalty *float64 `json:"errorPenalty,omitempty"`
	// ErrorWeight is how many active requests a recent error counts as
	// under least_loaded (default 1; 0 turns the protection against
	// sinkholing off).
	ErrorWeight *int `json:"errorWeight,omitempty"`
	// EjectAfter is how many calls in a row must end at their deadlines
	// with nothing received from a backend before it is ejected (default
	// 5; 0 disables ejection), and Ejection how long its first ejection
	// lasts ("1s" by default; doubled for each in a row, at most 30s).
	EjectAfter *int   `json:"ejectAfter,omitempty"`
	Ejection   string `json:"ejection,omitempty"`
	// StallPicks and StallAfter eject a backend before its calls'
	// deadlines: picked StallPicks times since its last answer (default
	// 4; 0 disables it), then nothing from it for StallAfter ("250ms" by
	// default, at most 30s) while other backends answer.
	StallPicks *int   `json:"stallPicks,omitempty"`
	StallAfter string `json:"stallAfter,omitempty"`
	// OOBLoadReport subscribes to each backend's out-of-band load reports
	// (ORCA's OpenRcaService: triagegrpc.RegisterLoadReportService), so
	// that weighted round robin has every backend's load from its first
	// pick, before any call of its own; Blackout then defaults to 0 (the
	// reports describe the backends' load from their other clients).
	// OOBReportPeriod is the interval asked for ("10s" by default, at most
	// 1h; servers on grpc-go's orca package send at most every 30 s).
	OOBLoadReport   bool   `json:"oobLoadReport,omitempty"`
	OOBReportPeriod string `json:"oobReportPeriod,omitempty"`

	opts         []balance.Option
	alg          subset.Algorithm
	replaceAfter time.Duration
	oobPeriod    time.Duration
}

// DefaultOOBReportPeriod is the out-of-band report interval a balancer
// asks for: grpc-go's weighted_round_robin's.
const DefaultOOBReportPeriod = 10 * time.Second

// countAndDuration reads a pair of settings (a count of calls, 0 to
// 65536, and a duration in (0, MaxEjection] unless the count is 0),
// either of them defaulted.
func countAndDuration(nName string, n *int, defN int, dName, d string, defD time.Duration) (int, time.Duration, error) {
	cn, cd := defN, defD
	if n != nil {
		cn = *n
	}
	if d != "" {
		var err error
		if cd, err = time.ParseDuration(d); err != nil {
			return 0, 0, fmt.Errorf("%s %q is not a duration", dName, d)
		}
	}
	if cn < 0 || cn > 1<<16 || cn > 0 && (cd <= 0 || cd > balance.MaxEjection) {
		return 0, 0, fmt.Errorf("%s %d, %s %v (want 0 to 65536 calls, and a duration in (0, %v])", nName, cn, dName, cd, balance.MaxEjection)
	}
	return cn, cd, nil
}

// ParseConfig parses and validates a "triage" balancer
// configuration.
func ParseConfig(js []byte) (*Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("triage balancer: %w", err)
	}
	for _, step := range []func() error{c.balanceOptions, c.failureOptions, c.subsetOptions} {
		if err := step(); err != nil {
			return nil, fmt.Errorf("triage balancer: %w", err)
		}
	}
	if _, err := balance.New(c.opts...); err != nil { // validates the values
		return nil, fmt.Errorf("triage balancer: %w", err)
	}
	return &c, nil
}

// balanceOptions reads the policy, the cap on active requests and the
// durations of the load picture.
func (c *Config) balanceOptions() error {
	if c.Policy == "" {
		c.Policy = balance.RoundRobin.String()
	}
	p, err := balance.ParsePolicy(c.Policy)
	if err != nil {
		return err
	}
	c.opts = append(c.opts, balance.WithPolicy(p))
	switch {
	case c.MaxActive < -1:
		return fmt.Errorf("maxActive %d (want -1 to disable, or a positive cap)", c.MaxActive)
	case c.MaxActive == -1:
		c.opts = append(c.opts, balance.WithMaxActive(0))
	case c.MaxActive > 0:
		c.opts = append(c.opts, balance.WithMaxActive(c.MaxActive))
	}
	for _, d := range []struct {
		name, v string
		opt     func(time.Duration) balance.Option
	}{{"errorWindow", c.ErrorWindow, balance.WithErrorWindow}, {"weightPeriod", c.WeightPeriod, balance.WithWeightPeriod}, {"blackout", c.Blackout, balance.WithBlackout}, {"expiry", c.Expiry, balance.WithExpiry}} {
		if d.v == "" {
			continue
		}
		v, err := time.ParseDuration(d.v)
		if err != nil || v < 0 || (v == 0 && d.name != "blackout") {
			return fmt.Errorf("%s %q is not a positive duration", d.name, d.v)
		}
		c.opts = append(c.opts, d.opt(v))
	}
	c.oobPeriod = DefaultOOBReportPeriod
	if c.OOBReportPeriod != "" {
		d, err := time.ParseDuration(c.OOBReportPeriod)
		if err != nil || d <= 0 || d > time.Hour {
			return fmt.Errorf("oobReportPeriod %q is not a duration in (0, 1h]", c.OOBReportPeriod)
		}
		c.oobPeriod = d
	}
	if c.OOBLoadReport && c.Blackout == "" {
		c.opts = append(c.opts, balance.WithBlackout(0))
	}
	return nil
}

// failureOptions reads how errors weigh, and when a backend is ejected
// or counted as stalled.
func (c *Config) failureOptions() error {
	if c.ErrorPenalty != nil {
		c.opts = append(c.opts, balance.WithErrorPenalty(*c.ErrorPenalty))
	}
	if c.ErrorWeight != nil {
		c.opts = append(c.opts, balance.WithErrorWeight(*c.ErrorWeight))
	}
	if c.EjectAfter != nil || c.Ejection != "" {
		n, d, err := countAndDuration("ejectAfter", c.EjectAfter, balance.DefaultEjectAfter, "ejection", c.Ejection, balance.DefaultEjection)
		if err != nil {
			return err
		}
		c.opts = append(c.opts, balance.WithEjection(n, d))
	}
	if c.StallPicks != nil || c.StallAfter != "" {
		n, d, err := countAndDuration("stallPicks", c.StallPicks, balance.DefaultStallPicks, "stallAfter", c.StallAfter, balance.DefaultStallAfter)
		if err != nil {
			return err
		}
		c.opts = append(c.opts, balance.WithStall(n, d))
	}
	return nil
}

// subsetOptions reads the subset's size, algorithm, client id and
// replacement delay.
func (c *Config) subsetOptions() error {
	if c.SubsetSize < -1 {
		return fmt.Errorf("subsetSize %d (want -1 for every backend, or a positive size)", c.SubsetSize)
	}
	c.replaceAfter = subset.DefaultReplaceAfter
	if c.ReplaceAfter != "" {
		d, err := time.ParseDuration(c.ReplaceAfter)
		if err != nil || d <= 0 || d > time.Minute {
			return fmt.Errorf("replaceAfter %q is not a duration in (0, 1m]", c.ReplaceAfter)
		}
		c.replaceAfter = d
	}
	if c.SubsetAlgorithm == "" {
		c.SubsetAlgorithm = "deterministic"
	}
	var err error
	if c.alg, err = subset.ByName(c.SubsetAlgorithm, 0); err != nil {
		return err
	}
	if c.ClientID != nil && *c.ClientID < 0 {
		return fmt.Errorf("clientId %d (want >= 0)", *c.ClientID)
	}
	return nil
}

func sameConfig(a, b *Config) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}
