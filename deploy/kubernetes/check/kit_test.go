package check

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// repo is the repository's root; kit is deploy/kubernetes.
var (
	repo = filepath.Join("..", "..", "..")
	kit  = filepath.Join("..")
)

// overlays are the kit's overlays and the namespace each deploys to.
var overlays = map[string]string{"dev": "triage-dev", "production": "triage"}

// built is one overlay's objects, by kind and name.
type built struct {
	overlay, namespace string
	objects            []object
}

type object struct {
	kind, name string
	value      any // a pointer to the typed object
}

// typed returns a new typed object for apiVersion and kind.
func typed(apiVersion, kind string) (any, bool) {
	switch apiVersion + "/" + kind {
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, true
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, true
	case "v1/Secret":
		return &corev1.Secret{}, true
	case "v1/Service":
		return &corev1.Service{}, true
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, true
	case "apps/v1/StatefulSet":
		return &appsv1.StatefulSet{}, true
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, true
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, true
	case "autoscaling/v2/HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, true
	case "monitoring.coreos.com/v1/PrometheusRule":
		return &monitoringv1.PrometheusRule{}, true
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, true
	}
	return nil, false
}

// build runs `kubectl kustomize` on a copy of the kit whose overlay has
// throwaway certificates (cmd/devcerts) under certs/, and decodes every
// object strictly: a field the API type does not have is an error.
func build(t *testing.T, overlay, namespace string) *built {
	t.Helper()
	return buildWith(t, overlay, namespace, "")
}

// buildWith builds the overlay, its kustomization.yaml replaced by
// kustomization unless that is empty, in a copy of the kit.
func buildWith(t *testing.T, overlay, namespace, kustomization string) *built {
	t.Helper()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatal("kubectl is needed (Debian's kubernetes-client; .ci/run installs it)")
	}
	dir := t.TempDir()
	copyTree(t, kit, dir, func(rel string) bool { return rel == "check" || strings.HasSuffix(rel, "/certs") })
	if kustomization != "" {
		if err := os.MkdirAll(filepath.Join(dir, "overlays", overlay), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "overlays", overlay, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	certs := filepath.Join(dir, "overlays", overlay, "certs")
	run(t, ".", "go", "run", "./cmd/devcerts", "-namespace", namespace, certs)
	out := run(t, ".", kubectl, "kustomize", filepath.Join(dir, "overlays", overlay))
	b := &built{overlay: overlay, namespace: namespace}
	for _, doc := range bytes.Split(out, []byte("\n---\n")) {
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name, Namespace string
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("%s: %v", overlay, err)
		}
		v, ok := typed(meta.APIVersion, meta.Kind)
		if !ok {
			t.Errorf("%s: %s %s %q: a kind the check does not know", overlay, meta.APIVersion, meta.Kind, meta.Metadata.Name)
			continue
		}
		if err := yaml.UnmarshalStrict(doc, v); err != nil {
			t.Errorf("%s: %s %q does not decode strictly: %v", overlay, meta.Kind, meta.Metadata.Name, err)
			continue
		}
		if meta.Metadata.Namespace != namespace {
			t.Errorf("%s: %s %q in namespace %q, want %q", overlay, meta.Kind, meta.Metadata.Name, meta.Metadata.Namespace, namespace)
		}
		b.objects = append(b.objects, object{kind: meta.Kind, name: meta.Metadata.Name, value: v})
	}
	return b
}

// get returns the object of kind and name, or nil.
func (b *built) get(kind, name string) any {
	for _, o := range b.objects {
		if o.kind == kind && o.name == name {
			return o.value
		}
	}
	return nil
}

// all returns the objects of kind.
func (b *built) all(kind string) []object {
	var out []object
	for _, o := range b.objects {
		if o.kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// workload is a Deployment's or StatefulSet's pod template.
type workload struct {
	kind, name string
	replicas   int32
	selector   map[string]string
	pod        corev1.PodTemplateSpec
}

func (b *built) workloads() []workload {
	var out []workload
	for _, o := range b.objects {
		switch v := o.value.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{o.kind, o.name, deref(v.Spec.Replicas), v.Spec.Selector.MatchLabels, v.Spec.Template})
		case *appsv1.StatefulSet:
			out = append(out, workload{o.kind, o.name, deref(v.Spec.Replicas), v.Spec.Selector.MatchLabels, v.Spec.Template})
		}
	}
	return out
}

func deref(p *int32) int32 {
	if p == nil {
		return 1
	}
	return *p
}

// selects reports whether selector (non-empty) selects labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func run(t *testing.T, dir, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// copyTree copies src to dst, skipping what skip names (paths relative
// to src, slash-separated).
func copyTree(t *testing.T, src, dst string, skip func(rel string) bool) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		rel = filepath.ToSlash(rel)
		if rel != "." && skip(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// triage builds cmd/triage once per test binary.
var triageBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "triage-kit-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	triageBinary = filepath.Join(dir, "triage")
	cmd := exec.Command("go", "build", "-o", triageBinary, "./cmd/triage")
	cmd.Dir = repo
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building cmd/triage:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// help returns `triage COMMAND -h`'s flag listing: flag name -> its
// usage text (the default in it).
func help(t *testing.T, command string) map[string]string {
	t.Helper()
	cmd := exec.Command(triageBinary, command, "-h")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run()
	flags := map[string]string{}
	var name string
	for _, line := range strings.Split(out.String(), "\n") {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			name = m[1]
			flags[name] = ""
			continue
		}
		if name != "" && strings.HasPrefix(line, "    \t") {
			flags[name] += strings.TrimPrefix(line, "    \t") + " "
		}
	}
	if len(flags) == 0 {
		t.Fatalf("triage %s -h listed no flags:\n%s", command, out.String())
	}
	return flags
}

var flagLine = regexp.MustCompile(`^  -([a-z0-9-]+)`)

// defaultOf is the default a flag's usage text states.
func defaultOf(usage string) string {
	m := regexp.MustCompile(`\(default "?([^")]*)"?\)`).FindStringSubmatch(usage)
	if m == nil {
		return ""
	}
	return m[1]
}
