package triageextproc_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// decodeEnvoyYAML decodes a block of Envoy configuration as the docs show
// it: top-level http_filters (HttpConnectionManager's), clusters, and
// http_connection_manager (the manager's own fields),
// strictly into Envoy's API types (go-control-plane's messages, the same
// v1.40 API the processor speaks): an unknown field, a misspelt one, a
// typed_config of a type Envoy does not have, or a value of the wrong
// type is an error.
func decodeEnvoyYAML(src string) error {
	var top map[string]any
	if err := yaml.Unmarshal([]byte(src), &top); err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	if len(top) == 0 {
		return fmt.Errorf("an empty block")
	}
	for key, v := range top {
		if key == "http_connection_manager" { // its fields, as in a filter's typed_config
			b, err := json.Marshal(v)
			if err != nil {
				return err
			}
			if err := protojson.Unmarshal(b, &hcmv3.HttpConnectionManager{}); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			continue
		}
		items, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s: want a list", key)
		}
		for i, item := range items {
			var m proto.Message
			switch key {
			case "http_filters":
				m = &hcmv3.HttpFilter{}
			case "clusters":
				m = &clusterv3.Cluster{}
			default:
				return fmt.Errorf("top-level %q: the test knows http_filters and clusters", key)
			}
			b, err := json.Marshal(item)
			if err != nil {
				return fmt.Errorf("%s[%d]: %w", key, i, err)
			}
			if err := protojson.Unmarshal(b, m); err != nil { // DiscardUnknown false: strict
				return fmt.Errorf("%s[%d]: %w", key, i, err)
			}
		}
	}
	return nil
}

// Every YAML block of docs/envoy.md is Envoy configuration that Envoy's
// own types accept, field by field: a typo in a field name fails here,
// not in a user's Envoy (issue 55).
func TestEnvoyDocsDecodeStrictly(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "docs", "envoy.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(src), -1)
	if len(blocks) == 0 {
		t.Fatal("no yaml block in docs/envoy.md")
	}
	for i, b := range blocks {
		if err := decodeEnvoyYAML(b[1]); err != nil {
			t.Errorf("docs/envoy.md, yaml block %d: %v", i+1, err)
		}
	}
	// The decoder refuses what Envoy would.
	for name, bad := range map[string]string{
		"a misspelt field":  "http_filters:\n- name: x\n  typed_config:\n    \"@type\": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor\n    failure_mode_alow: true\n",
		"an unknown type":   "http_filters:\n- name: x\n  typed_config:\n    \"@type\": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcesor\n",
		"a wrong value":     "clusters:\n- name: c\n  type: STATICK\n",
		"a manager's field": "http_connection_manager:\n  use_remote_adress: true\n",
		"a duration":        "http_filters:\n- name: x\n  typed_config:\n    \"@type\": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor\n    message_timeout: 200ms\n",
	} {
		if err := decodeEnvoyYAML(bad); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}
