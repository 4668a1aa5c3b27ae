package triageextproc_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	hmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/triagehq/triage/wire"
)

// docsFiltersBeforeProcessor returns what the header_mutation filters
// that docs/envoy.md's configuration puts before the ext_proc filter do
// to a request's headers, decoded strictly from the docs and applied as
// Envoy applies them (in order: remove, remove_on_match, append with a
// literal value or %REQ(name)%, empty values dropped unless
// keep_empty_value).
func docsFiltersBeforeProcessor(t *testing.T) func(http.Header) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "docs", "envoy.md"))
	if err != nil {
		t.Fatal(err)
	}
	var filters []*hmv3.HeaderMutation
	for _, b := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(src), -1) {
		var top struct {
			Filters []map[string]any `yaml:"http_filters"`
		}
		if err := yaml.Unmarshal([]byte(b[1]), &top); err != nil {
			t.Fatal(err)
		}
		for _, f := range top.Filters {
			if f["name"] == "envoy.filters.http.ext_proc" {
				break
			}
			if f["name"] != "envoy.filters.http.header_mutation" {
				continue
			}
			tc := f["typed_config"].(map[string]any)
			delete(tc, "@type")
			j, _ := json.Marshal(tc)
			var hm hmv3.HeaderMutation
			if err := protojson.Unmarshal(j, &hm); err != nil {
				t.Fatal(err)
			}
			filters = append(filters, &hm)
		}
	}
	if len(filters) == 0 {
		t.Fatal("docs/envoy.md puts no header_mutation filter before ext_proc")
	}
	req := regexp.MustCompile(`^%REQ\(([^)]+)\)%$`)
	return func(h http.Header) {
		for _, f := range filters {
			for _, m := range f.GetMutations().GetRequestMutations() {
				switch {
				case m.GetRemove() != "":
					h.Del(m.GetRemove())
				case m.GetRemoveOnMatch() != nil:
					for k := range h {
						if matches(m.GetRemoveOnMatch().GetKeyMatcher(), strings.ToLower(k)) {
							delete(h, k)
						}
					}
				case m.GetAppend() != nil:
					o := m.GetAppend()
					v := o.GetHeader().GetValue()
					if sub := req.FindStringSubmatch(v); sub != nil {
						v = strings.Join(h.Values(sub[1]), ",")
					} else if strings.Contains(v, "%") {
						t.Fatalf("the stand-in knows %%REQ(name)%% only: %q", v)
					}
					if v == "" && !o.GetKeepEmptyValue() {
						continue
					}
					k := o.GetHeader().GetKey()
					switch o.GetAppendAction() {
					case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
						h.Set(k, v)
					case corev3.HeaderValueOption_ADD_IF_ABSENT:
						if h.Get(k) == "" {
							h.Set(k, v)
						}
					case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
						if h.Get(k) != "" {
							h.Set(k, v)
						}
					default:
						h.Add(k, v)
					}
				}
			}
		}
	}
}

// matches is a StringMatcher's prefix or exact match of a header name.
func matches(m *matcherv3.StringMatcher, k string) bool {
	fold := func(s string) string {
		if m.GetIgnoreCase() {
			return strings.ToLower(s)
		}
		return s
	}
	switch {
	case m.GetPrefix() != "":
		return strings.HasPrefix(fold(k), fold(m.GetPrefix()))
	case m.GetExact() != "":
		return fold(k) == fold(m.GetExact())
	}
	return false
}

// Envoy failing open never forwards a caller's triage keys (issue 55):
// with the filters docs/envoy.md puts before the processor, a request
// that goes on unprocessed (the processor gone, or past message_timeout)
// reaches the upstream with no triage-* header, whatever the caller sent,
// folded spellings included (the claims, which no service reads, go on);
// with the processor up, a trusted caller's
// keys are believed and an untrusted one's are not, as without the
// filters, and no claim header reaches the upstream.
func TestFailOpenForwardsNoCallerKeys(t *testing.T) {
	before := docsFiltersBeforeProcessor(t)
	ctx := context.Background()
	claims := func() http.Header {
		return http.Header{"Triage-Criticality": {"CRITICAL_PLUS"}, "Triage-Customer": {"mallory"}, "Triage-Attempt": {"1"},
			"Triage-Criticality-Decay": {"100:SHEDDABLE"}, "Triage_criticality": {"CRITICAL_PLUS"}}
	}

	t.Run("processor gone", func(t *testing.T) {
		r := newRig(t)
		r.gone(t)
		r.env.failOpen, r.env.before = true, before
		a := r.env.do(ctx, "GET", "/", claims(), nil)
		seen := a.upstreamSaw.Get("Seen")
		if a.status != 200 || !strings.HasPrefix(a.how, "unprocessed") || strings.Contains(" "+seen, " triage") {
			t.Fatalf("got %d %q, the upstream saw %q, want no triage key (claims only)", a.status, a.how, seen)
		}
	})

	t.Run("trusted caller", func(t *testing.T) {
		r := newRig(t)
		r.env.before = before
		a := r.env.do(ctx, "GET", "/search", claims(), nil)
		want := "triage-attempt=1 triage-criticality-decay=100:SHEDDABLE triage-criticality=CRITICAL_PLUS triage-customer=mallory"
		if a.status != 200 || a.how != "processed" || a.upstreamSaw.Get("Seen") != want {
			t.Fatalf("got %d %q, the upstream saw %q, want %q", a.status, a.how, a.upstreamSaw.Get("Seen"), want)
		}
	})

	t.Run("untrusted caller", func(t *testing.T) {
		r := newRig(t)
		r.env.before, r.env.peer = before, "192.0.2.7:40000"
		a := r.env.do(ctx, "GET", "/search", claims(), nil)
		if a.status != 200 || a.upstreamSaw.Get("Seen") != "triage-criticality=SHEDDABLE_PLUS" {
			t.Fatalf("got %d %q, the upstream saw %q", a.status, a.how, a.upstreamSaw.Get("Seen"))
		}
	})

	t.Run("every request key claimed", func(t *testing.T) {
		h := http.Header{}
		for _, k := range wire.Keys() {
			if k.Direction == wire.Request {
				h.Set(k.Name, "x")
			}
		}
		before(h)
		for _, k := range wire.Keys() {
			if k.Direction == wire.Request && h.Get(wire.ClaimPrefix+strings.TrimPrefix(k.Name, wire.Prefix)) != "x" {
				t.Errorf("docs/envoy.md's filter does not keep the caller's %s as a claim", k.Name)
			}
		}
	})
}
