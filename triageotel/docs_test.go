package triageotel_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/triagehq/triage/triageotel"
)

// docs/opentelemetry.md shows Example's body as its wiring (the main
// module's documentation test cannot build it: OpenTelemetry is not in
// that module) and lists every instrument Names maps.
func TestDocsMatchTheCode(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "opentelemetry.md"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	s := string(src)
	body := s[strings.Index(s, "func Example() {\n")+len("func Example() {\n") : strings.LastIndex(s, "}")]
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(body, "\n"), "\n") {
		lines = append(lines, strings.TrimPrefix(l, "\t"))
	}
	block := "```text\n" + strings.Join(lines, "\n") + "\n```"
	if !strings.Contains(string(doc), block) {
		t.Error("docs/opentelemetry.md's wiring block is not Example's body: copy it again")
	}
	for prom, otel := range triageotel.Names() {
		if !strings.Contains(string(doc), "| `"+prom+"` | `"+otel+"` |") {
			t.Errorf("docs/opentelemetry.md does not list %s -> %s", prom, otel)
		}
	}
}
