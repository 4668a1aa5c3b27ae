// Package triageyaml loads triage's configuration files from YAML. Core
// packages define their configuration as plain structs (edge.Config,
// trust.Config) and import only the standard library; this adapter is where
// the YAML parser (go.yaml.in/yaml/v3) lives.
//
// Parsing is strict: unknown fields, a second document, or a file over
// MaxSize are errors that name the problem, never silently ignored.
package triageyaml

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"

	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/trust"
)

// MaxSize bounds a configuration file: 1 MiB.
const MaxSize = 1 << 20

// Edge is the configuration of a service's edge: whom to trust and how to
// assign criticality.
//
//	trust:
//	  networks: ["10.0.0.0/8"]            # peers whose triage headers are believed
//	  identities: ["spiffe://prod/proxy"] # mTLS identities likewise
//	  forwarders:                         # proxies whose x-forwarded-client-cert names the caller
//	    networks: ["127.0.0.6/32"]        # (a mesh's sidecar; docs/trust.md)
//	criticality:
//	  default: CRITICAL                   # when no rule matches
//	  rules:                              # first match wins
//	    - header: true                    # a trusted peer's triage-criticality
//	    - host: batch.example.com
//	      criticality: SHEDDABLE
//	    - path_prefix: /checkout
//	      criticality: CRITICAL_PLUS
//	    - group: free-tier
//	      criticality: SHEDDABLE_PLUS
type Edge struct {
	Trust       trust.Config `yaml:"trust"`
	Criticality edge.Config  `yaml:"criticality"`
}

// ParseEdge parses and validates an Edge configuration.
func ParseEdge(b []byte) (Edge, error) {
	var e Edge
	if err := decodeStrict(b, &e); err != nil {
		return Edge{}, fmt.Errorf("triageyaml: edge config: %w", err)
	}
	if _, _, err := e.Build(); err != nil {
		return Edge{}, fmt.Errorf("triageyaml: edge config: %s%w", edgeErrorAt(b, e), err)
	}
	return e, nil
}

// edgeErrorAt returns "line L, column C: " for the first part of e that
// does not build on its own (a trusted network or identity, the default,
// a rule), found in b's YAML nodes, or "" when no single part fails.
func edgeErrorAt(b []byte, e Edge) string {
	var doc yaml.Node
	if yaml.Unmarshal(b, &doc) != nil || len(doc.Content) == 0 {
		return ""
	}
	root := doc.Content[0]
	at := func(n *yaml.Node) string {
		if n == nil {
			return ""
		}
		return fmt.Sprintf("line %d, column %d: ", n.Line, n.Column)
	}
	tr := mapValue(root, "trust")
	for i, n := range e.Trust.Networks {
		if _, err := trust.New(trust.Config{Networks: []string{n}}); err != nil {
			return at(seqItem(mapValue(tr, "networks"), i))
		}
	}
	for i, id := range e.Trust.Identities {
		if _, err := trust.New(trust.Config{Identities: []string{id}}); err != nil {
			return at(seqItem(mapValue(tr, "identities"), i))
		}
	}
	fw := mapValue(tr, "forwarders")
	for i, n := range e.Trust.Forwarders.Networks {
		if _, err := trust.New(trust.Config{Networks: []string{n}}); err != nil {
			return at(seqItem(mapValue(fw, "networks"), i))
		}
	}
	for i, id := range e.Trust.Forwarders.Identities {
		if _, err := trust.New(trust.Config{Identities: []string{id}}); err != nil {
			return at(seqItem(mapValue(fw, "identities"), i))
		}
	}
	cr := mapValue(root, "criticality")
	if _, err := edge.New(edge.Config{Default: e.Criticality.Default}); err != nil {
		return at(mapValue(cr, "default"))
	}
	for i, r := range e.Criticality.Rules {
		if _, err := edge.New(edge.Config{Rules: []edge.RuleConfig{r}}); err != nil {
			return at(seqItem(mapValue(cr, "rules"), i))
		}
	}
	return at(mapValue(cr, "rules")) // too many rules
}

// mapValue returns the value of key in the mapping n, or nil.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// seqItem returns the i-th item of the sequence n, or nil.
func seqItem(n *yaml.Node, i int) *yaml.Node {
	if n == nil || n.Kind != yaml.SequenceNode || i >= len(n.Content) {
		return nil
	}
	return n.Content[i]
}

// LoadEdge reads and parses an Edge configuration file.
func LoadEdge(path string) (Edge, error) {
	b, err := readBounded(path)
	if err != nil {
		return Edge{}, err
	}
	e, err := ParseEdge(b)
	if err != nil {
		return Edge{}, fmt.Errorf("%s: %w", path, err)
	}
	return e, nil
}

// Build makes the trust policy and the classifier the configuration
// describes.
func (e Edge) Build(opts ...edge.Option) (*trust.Policy, *edge.Classifier, error) {
	pol, err := trust.New(e.Trust)
	if err != nil {
		return nil, nil, err
	}
	cl, err := edge.New(e.Criticality, opts...)
	if err != nil {
		return nil, nil, err
	}
	return pol, cl, nil
}

// ParseQuota parses and validates a quota policy (see quota.Config for
// the format). A policy with any problem is refused as a whole; callers
// reloading a file keep the policy in force when this returns an error.
func ParseQuota(b []byte) (*quota.Policy, error) {
	var c quota.Config
	if err := decodeStrict(b, &c); err != nil {
		return nil, fmt.Errorf("triageyaml: quota policy: %w", err)
	}
	p, err := quota.New(c)
	if err != nil {
		return nil, fmt.Errorf("triageyaml: %w", err)
	}
	return p, nil
}

// ParseIsolation parses and validates an isolation table (see
// isolate.Config for the format):
//
//	clients:
//	  - name: maps
//	    hosts: [maps.api.example.com]
//	  - name: rogue
//	    hosts: [rogue.api.example.com]
//	    route: sacrificial        # or shared (default), black-hole
//	sacrificial: ["10.0.0.7:8080"]
func ParseIsolation(b []byte) (isolate.Config, error) {
	var c isolate.Config
	if err := decodeStrict(b, &c); err != nil {
		return isolate.Config{}, fmt.Errorf("triageyaml: isolation: %w", err)
	}
	if _, err := isolate.New(c); err != nil {
		return isolate.Config{}, fmt.Errorf("triageyaml: %w", err)
	}
	return c, nil
}

// LoadQuota reads and parses a quota policy file.
func LoadQuota(path string) (*quota.Policy, error) {
	b, err := readBounded(path)
	if err != nil {
		return nil, err
	}
	p, err := ParseQuota(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("triageyaml: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("triageyaml: %s: %w", path, err)
	}
	return b, nil
}

func decodeStrict(b []byte, into any) error {
	if len(b) > MaxSize {
		return fmt.Errorf("larger than %d bytes", MaxSize)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(into); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("empty document")
		}
		return err
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return errors.New("more than one YAML document")
	}
	return nil
}
