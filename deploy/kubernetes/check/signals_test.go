package check

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/triagehq/triage/triageyaml"
)

// The HPA's external metric is one the Prometheus adapter's rules serve,
// from a series triage's recording rules record; its Resource metric is
// CPU, which every container of the target requests.
func checkAutoscaling(t *testing.T, b *built) {
	cm, _ := b.get("ConfigMap", "triage-prometheus-adapter").(*corev1.ConfigMap)
	if cm == nil {
		t.Fatal("no ConfigMap triage-prometheus-adapter")
	}
	var adapter struct {
		ExternalRules []struct {
			SeriesQuery string `json:"seriesQuery"`
			Resources   struct {
				Namespaced *bool `json:"namespaced"`
			} `json:"resources"`
			Name struct {
				As string `json:"as"`
			} `json:"name"`
			MetricsQuery string `json:"metricsQuery"`
		} `json:"externalRules"`
	}
	if err := yaml.UnmarshalStrict([]byte(cm.Data["config.yaml"]), &adapter); err != nil {
		t.Fatalf("the adapter's config: %v", err)
	}
	served := map[string]string{}
	for _, r := range adapter.ExternalRules {
		served[r.Name.As] = r.SeriesQuery
	}
	recorded := recordedSeries(t, b)
	for _, o := range b.all("HorizontalPodAutoscaler") {
		hpa := o.value.(*autoscalingv2.HorizontalPodAutoscaler)
		external := 0
		for _, m := range hpa.Spec.Metrics {
			switch m.Type {
			case autoscalingv2.ExternalMetricSourceType:
				external++
				q, ok := served[m.External.Metric.Name]
				if !ok {
					t.Errorf("HPA %s: external metric %q is not one the adapter serves (%v)", o.name, m.External.Metric.Name, served)
					continue
				}
				series, _, _ := strings.Cut(q, "{")
				if !recorded[series] {
					t.Errorf("HPA %s: %q reads %s, which no rule records", o.name, m.External.Metric.Name, series)
				}
			case autoscalingv2.ResourceMetricSourceType:
				w := b.workload(hpa.Spec.ScaleTargetRef.Name)
				for _, c := range w.pod.Spec.Containers {
					if c.Resources.Requests.Name(m.Resource.Name, "").IsZero() {
						t.Errorf("HPA %s: %s utilization, but %s requests none", o.name, m.Resource.Name, c.Name)
					}
				}
			}
		}
		if external == 0 {
			t.Errorf("HPA %s scales on no triage signal", o.name)
		}
	}
}

// recordedSeries are the series the PrometheusRule's rules record.
func recordedSeries(t *testing.T, b *built) map[string]bool {
	out := map[string]bool{}
	for _, o := range b.all("PrometheusRule") {
		for _, g := range o.value.(*monitoringv1.PrometheusRule).Spec.Groups {
			for _, r := range g.Rules {
				if r.Record != "" {
					out[r.Record] = true
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no recording rule in the build")
	}
	return out
}

// The PrometheusRule's groups are deploy/prometheus/triage-rules.yml's,
// and `promtool check rules` passes them.
func checkRules(t *testing.T, b *built) {
	pr, _ := b.get("PrometheusRule", "triage").(*monitoringv1.PrometheusRule)
	if pr == nil {
		t.Fatal("no PrometheusRule triage")
	}
	// kube-prometheus-stack loads rules and monitors labelled with its
	// release; `prometheus: k8s` (kube-prometheus's) it ignores.
	sm, _ := b.get("ServiceMonitor", "triage").(*monitoringv1.ServiceMonitor)
	if sm == nil {
		t.Fatal("no ServiceMonitor triage")
	}
	for kind, labels := range map[string]map[string]string{"PrometheusRule": pr.Labels, "ServiceMonitor": sm.GetLabels()} {
		if labels["release"] == "" {
			t.Errorf("the %s has no release label: kube-prometheus-stack would not load it (labels %v)", kind, labels)
		}
	}
	raw, err := os.ReadFile(filepath.Join(repo, "deploy", "prometheus", "triage-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []monitoringv1.RuleGroup `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(raw, &file); err != nil {
		t.Fatalf("triage-rules.yml: %v", err)
	}
	if !reflect.DeepEqual(file.Groups, pr.Spec.Groups) {
		t.Error("the PrometheusRule's groups differ from deploy/prometheus/triage-rules.yml: copy them again")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is needed (Debian's prometheus; .ci/run installs it)")
	}
	out, err := yaml.Marshal(struct {
		Groups []monitoringv1.RuleGroup `json:"groups"`
	}{pr.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rules.yml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, ".", promtool, "check", "rules", path)
}

// The dashboard ConfigMap holds deploy/grafana/triage-dashboard.json.
func checkDashboard(t *testing.T, b *built) {
	cm, _ := b.get("ConfigMap", "triage-dashboard").(*corev1.ConfigMap)
	if cm == nil || cm.Labels["grafana_dashboard"] != "1" {
		t.Fatal("no ConfigMap triage-dashboard labelled grafana_dashboard")
	}
	want, err := os.ReadFile(filepath.Join(repo, "deploy", "grafana", "triage-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data["triage-dashboard.json"] != string(want) {
		t.Error("the dashboard ConfigMap differs from deploy/grafana/triage-dashboard.json: copy it again")
	}
	var v map[string]any
	if err := json.Unmarshal(want, &v); err != nil {
		t.Error(err)
	}
}

// The sidecar's edge configuration parses (triageyaml, as the sidecar
// reads it), and the identities it trusts are in the overlay's
// namespace; the app is bench/polyglot/upstream.py.
func checkEdge(t *testing.T, b *built) {
	for _, tc := range b.triageContainers(t) {
		if tc.command != "sidecar" {
			continue
		}
		file := filepath.Base(tc.flags["config"])
		var cm *corev1.ConfigMap
		for _, o := range b.all("ConfigMap") {
			if c := o.value.(*corev1.ConfigMap); c.Data[file] != "" {
				cm = c
			}
		}
		if cm == nil {
			t.Fatalf("no ConfigMap holds %s", file)
		}
		e, err := triageyaml.ParseEdge([]byte(cm.Data[file]))
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range e.Trust.Identities {
			if !strings.Contains(id, "/ns/"+b.namespace+"/") {
				t.Errorf("the edge trusts %q, not an identity of namespace %s", id, b.namespace)
			}
		}
	}
	app, _ := b.get("ConfigMap", configMapNamed(b, "shop-app")).(*corev1.ConfigMap)
	want, err := os.ReadFile(filepath.Join(repo, "bench", "polyglot", "upstream.py"))
	if err != nil {
		t.Fatal(err)
	}
	if app == nil || app.Data["shop-app.py"] != string(want) {
		t.Error("components/shop/shop-app.py differs from bench/polyglot/upstream.py: copy it again")
	}
}

// configMapNamed finds a generated ConfigMap by its name before the hash.
func configMapNamed(b *built, prefix string) string {
	for _, o := range b.all("ConfigMap") {
		if strings.HasPrefix(o.name, prefix+"-") {
			return o.name
		}
	}
	return ""
}
