package check

import (
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/triagehq/triage/triagehttp"
)

// The checks, run on each overlay's build.
var checks = []struct {
	name string
	f    func(*testing.T, *built)
}{
	{"triage containers' flags", checkFlags},
	{"probes", checkProbes},
	{"grace period", checkGrace},
	{"references and selectors", checkReferences},
	{"resources and security", checkResources},
	{"autoscaling metric", checkAutoscaling},
	{"prometheus rules", checkRules},
	{"dashboard", checkDashboard},
	{"edge configuration", checkEdge},
	{"images pinned", checkImages},
	{"network policies", checkNetworkPolicies},
}

// Every workload's pods are selected by a NetworkPolicy, and etcd's
// client port admits only the quota service's pods (the quota policy
// lives there).
func checkNetworkPolicies(t *testing.T, b *built) {
	var pols []*networkingv1.NetworkPolicy
	for _, o := range b.objects {
		if p, ok := o.value.(*networkingv1.NetworkPolicy); ok {
			pols = append(pols, p)
		}
	}
	selects := func(p *networkingv1.NetworkPolicy, labels map[string]string) bool {
		for k, v := range p.Spec.PodSelector.MatchLabels {
			if labels[k] != v {
				return false
			}
		}
		return len(p.Spec.PodSelector.MatchExpressions) == 0
	}
	for _, w := range b.workloads() {
		var mine []*networkingv1.NetworkPolicy
		for _, p := range pols {
			if selects(p, w.pod.Labels) {
				mine = append(mine, p)
			}
		}
		if len(mine) == 0 {
			t.Errorf("%s %s: no NetworkPolicy selects its pods", w.kind, w.name)
			continue
		}
		if w.name != "etcd" {
			continue
		}
		for _, p := range mine {
			for _, rule := range p.Spec.Ingress {
				for _, port := range rule.Ports {
					if port.Port == nil || port.Port.String() != "client" {
						continue
					}
					if len(rule.From) == 0 {
						t.Errorf("etcd's client port is open to every pod")
					}
					for _, from := range rule.From {
						if from.PodSelector == nil || from.PodSelector.MatchLabels["app.kubernetes.io/name"] != "quota" || from.NamespaceSelector != nil || from.IPBlock != nil {
							t.Errorf("etcd's client port admits %+v, want the quota service's pods only", from)
						}
					}
				}
			}
		}
	}
}

// Every container's image names a version (a tag other than latest, or a
// digest), so that a rollout runs what was tested and the kubelet does not
// pull it again at each start (it pulls :latest and untagged images
// always, and a locally built image then fails to start).
func checkImages(t *testing.T, b *built) {
	triage := map[string]bool{} // the triage images: one release for the kit
	for _, w := range b.workloads() {
		for _, c := range append(w.pod.Spec.InitContainers, w.pod.Spec.Containers...) {
			ref := c.Image
			if strings.HasPrefix(ref, "ghcr.io/triagehq/triage:") {
				triage[ref] = true
			}
			if _, digest, ok := strings.Cut(ref, "@"); ok && strings.HasPrefix(digest, "sha256:") {
				continue
			}
			tag := ""
			if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
				tag = ref[i+1:]
			}
			if tag == "" || tag == "latest" || !strings.ContainsAny(tag, "0123456789") {
				t.Errorf("%s/%s: image %q is not pinned to a version", w.name, c.Name, ref)
			}
		}
	}
	if len(triage) > 1 {
		t.Errorf("the components run different releases of triage: %v", triage)
	}
}

func TestKit(t *testing.T) {
	for overlay, ns := range overlays {
		t.Run(overlay, func(t *testing.T) {
			b := build(t, overlay, ns)
			kinds := map[string]int{}
			for _, o := range b.objects {
				kinds[o.kind]++
			}
			t.Logf("%s: %d objects decoded strictly: %v", overlay, len(b.objects), kinds)
			for _, want := range []string{"Deployment", "StatefulSet", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "PrometheusRule", "ServiceMonitor", "Secret", "ConfigMap", "NetworkPolicy"} {
				if kinds[want] == 0 {
					t.Errorf("no %s in the build", want)
				}
			}
			for _, c := range checks {
				t.Run(c.name, func(t *testing.T) { c.f(t, b) })
			}
		})
	}
}

// triageContainer is a container running the triage image.
type triageContainer struct {
	w       workload
	c       corev1.Container
	command string
	flags   map[string]string // -name=value as given (names without the dash)
}

func (b *built) triageContainers(t *testing.T) []triageContainer {
	var out []triageContainer
	for _, w := range b.workloads() {
		for _, c := range w.pod.Spec.Containers {
			if !strings.HasPrefix(c.Image, "ghcr.io/triagehq/triage:") {
				continue
			}
			if len(c.Args) == 0 {
				t.Fatalf("%s/%s: no command in args", w.name, c.Name)
			}
			tc := triageContainer{w: w, c: c, command: c.Args[0], flags: map[string]string{}}
			for _, a := range c.Args[1:] {
				name, value, ok := strings.Cut(strings.TrimPrefix(a, "-"), "=")
				if !strings.HasPrefix(a, "-") || !ok {
					t.Errorf("%s/%s: argument %q is not -flag=value", w.name, c.Name, a)
				}
				tc.flags[name] = value
			}
			out = append(out, tc)
		}
	}
	if len(out) == 0 {
		t.Fatal("no container runs the triage image")
	}
	return out
}

// Every triage container's arguments parse as its command's flags: the
// command, given them and -h, parses them all and stops (a flag it does
// not have, or a value it cannot parse, exits 2 instead of 0). Variables
// the kubelet expands ($(POD_NAME)) are given a value first.
func checkFlags(t *testing.T, b *built) {
	for _, tc := range b.triageContainers(t) {
		args := make([]string, 0, len(tc.c.Args)+1)
		for _, a := range tc.c.Args {
			for _, e := range tc.c.Env {
				a = strings.ReplaceAll(a, "$("+e.Name+")", tc.w.name+"-0")
			}
			if strings.Contains(a, "$(") {
				t.Errorf("%s/%s: %q names a variable the container does not define", tc.w.name, tc.c.Name, a)
			}
			args = append(args, a)
		}
		cmd := exec.Command(triageBinary, append(args, "-h")...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%s/%s: triage %s does not accept its arguments (%v):\n%s", tc.w.name, tc.c.Name, tc.command, err, lastLines(string(out), 3))
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// portOf is the port number in an address flag ("0.0.0.0:9092").
func portOf(addr string) string {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return ""
	}
	return addr[i+1:]
}

// The probes of every triage container are the paths its command
// answers them at (-ready-path and -live-path's defaults or values for
// the sidecar, triagehttp.ReadyPath and LivePath for the others), on the
// container port that is its -metrics listener's.
func checkProbes(t *testing.T, b *built) {
	for _, tc := range b.triageContainers(t) {
		flags := help(t, tc.command)
		ready, live := triagehttp.ReadyPath, triagehttp.LivePath
		if _, ok := flags["ready-path"]; ok {
			ready, live = defaultOf(flags["ready-path"]), defaultOf(flags["live-path"])
			if v, ok := tc.flags["ready-path"]; ok {
				ready = v
			}
			if v, ok := tc.flags["live-path"]; ok {
				live = v
			}
		}
		metrics := portOf(tc.flags["metrics"])
		if metrics == "" {
			t.Errorf("%s/%s: no -metrics listener, where the probes are answered", tc.w.name, tc.c.Name)
			continue
		}
		for _, p := range []struct {
			what  string
			probe *corev1.Probe
			path  string
		}{{"readiness", tc.c.ReadinessProbe, ready}, {"liveness", tc.c.LivenessProbe, live}} {
			if p.probe == nil || p.probe.HTTPGet == nil {
				t.Errorf("%s/%s: no HTTP %s probe", tc.w.name, tc.c.Name, p.what)
				continue
			}
			if p.probe.HTTPGet.Path != p.path {
				t.Errorf("%s/%s: %s probe on %q, the command answers %q", tc.w.name, tc.c.Name, p.what, p.probe.HTTPGet.Path, p.path)
			}
			if got := containerPort(tc.c, p.probe.HTTPGet.Port.String()); got != metrics {
				t.Errorf("%s/%s: %s probe on port %s (%q), -metrics listens on %s", tc.w.name, tc.c.Name, p.what, got, p.probe.HTTPGet.Port.String(), metrics)
			}
		}
	}
}

// containerPort resolves a port name or number to the number.
func containerPort(c corev1.Container, port string) string {
	for _, p := range c.Ports {
		if p.Name == port {
			return itoa(p.ContainerPort)
		}
	}
	return port
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// The pod's grace period outlasts what the command may take after
// SIGTERM: its -drain (or the default) plus the bound after which it cuts
// calls still running (its -drain usage says "N s later"); another
// container's preStop sleep lasts at least as long (it keeps serving
// while the sidecar drains) and ends within the grace period.
func checkGrace(t *testing.T, b *built) {
	for _, tc := range b.triageContainers(t) {
		flags := help(t, tc.command)
		usage, ok := flags["drain"]
		if !ok {
			t.Errorf("triage %s has no -drain flag", tc.command)
			continue
		}
		drain := defaultOf(usage)
		if v, ok := tc.flags["drain"]; ok {
			drain = v
		}
		d, err := time.ParseDuration(drain)
		if err != nil {
			t.Errorf("%s/%s: -drain %q: %v", tc.w.name, tc.c.Name, drain, err)
			continue
		}
		m := regexp.MustCompile(`(\d+) s later`).FindStringSubmatch(usage)
		if m == nil {
			t.Fatalf("triage %s -drain's usage names no bound on the stop: %q", tc.command, usage)
		}
		stop, _ := time.ParseDuration(m[1] + "s")
		grace := time.Duration(30) * time.Second
		if g := tc.w.pod.Spec.TerminationGracePeriodSeconds; g != nil {
			grace = time.Duration(*g) * time.Second
		}
		if grace <= d+stop {
			t.Errorf("%s: terminationGracePeriodSeconds %v, not more than -drain %v + %v", tc.w.name, grace, d, stop)
		}
		for _, c := range tc.w.pod.Spec.Containers {
			if c.Name == tc.c.Name || c.Lifecycle == nil || c.Lifecycle.PreStop == nil {
				continue
			}
			if s := c.Lifecycle.PreStop.Sleep; s != nil {
				sleep := time.Duration(s.Seconds) * time.Second
				if sleep < d+stop || sleep >= grace {
					t.Errorf("%s/%s: preStop sleeps %v: want at least -drain + %v (%v) and less than the grace period %v", tc.w.name, c.Name, sleep, stop, d+stop, grace)
				}
			}
		}
		t.Logf("%s: grace %v > -drain %v + %v", tc.w.name, grace, d, stop)
	}
}

// Every Secret, ConfigMap and ServiceAccount a pod names exists; every
// Service, PodDisruptionBudget and ServiceMonitor selects pods or
// Services, and the ports they name exist; a StatefulSet's service is a
// headless Service; the HPA scales a workload that exists.
func checkReferences(t *testing.T, b *built) {
	for _, w := range b.workloads() {
		spec := w.pod.Spec
		if !selects(w.selector, w.pod.Labels) {
			t.Errorf("%s %s: its selector %v does not select its pods %v", w.kind, w.name, w.selector, w.pod.Labels)
		}
		if sa := spec.ServiceAccountName; sa != "" && b.get("ServiceAccount", sa) == nil {
			t.Errorf("%s: service account %q does not exist", w.name, sa)
		}
		for _, v := range spec.Volumes {
			if v.Secret != nil && b.get("Secret", v.Secret.SecretName) == nil {
				t.Errorf("%s: volume %s: Secret %q does not exist", w.name, v.Name, v.Secret.SecretName)
			}
			if v.ConfigMap != nil && b.get("ConfigMap", v.ConfigMap.Name) == nil {
				t.Errorf("%s: volume %s: ConfigMap %q does not exist", w.name, v.Name, v.ConfigMap.Name)
			}
		}
		for _, c := range spec.Containers {
			for _, m := range c.VolumeMounts {
				if !hasVolume(spec, m.Name) && !hasClaim(b, w, m.Name) {
					t.Errorf("%s/%s: mounts %q, which the pod does not have", w.name, c.Name, m.Name)
				}
			}
		}
	}
	for _, o := range b.all("Service") {
		svc := o.value.(*corev1.Service)
		pods := b.selected(svc.Spec.Selector)
		if len(pods) == 0 {
			t.Errorf("Service %s selects no pods (%v)", o.name, svc.Spec.Selector)
		}
		for _, p := range svc.Spec.Ports {
			if p.TargetPort.String() != "" && !anyContainerPort(pods, p.TargetPort.String()) {
				t.Errorf("Service %s: port %s targets %q, which its pods do not have", o.name, p.Name, p.TargetPort.String())
			}
		}
	}
	for _, o := range b.all("StatefulSet") {
		name := o.name
		w := b.workload(name)
		svc, _ := b.get("Service", serviceNameOf(b, name)).(*corev1.Service)
		if svc == nil || svc.Spec.ClusterIP != corev1.ClusterIPNone || !selects(svc.Spec.Selector, w.pod.Labels) {
			t.Errorf("StatefulSet %s: its serviceName %q is not a headless Service selecting its pods", name, serviceNameOf(b, name))
		}
	}
	for _, o := range b.all("PodDisruptionBudget") {
		pdb := o.value.(*policyv1.PodDisruptionBudget)
		pods := b.selected(pdb.Spec.Selector.MatchLabels)
		if len(pods) != 1 {
			t.Errorf("PodDisruptionBudget %s selects %d workloads, want 1", o.name, len(pods))
			continue
		}
		if m := pdb.Spec.MinAvailable; m != nil && int32(m.IntValue()) >= pods[0].replicas {
			t.Errorf("PodDisruptionBudget %s: minAvailable %v of %d replicas: no pod could ever be evicted", o.name, m, pods[0].replicas)
		}
	}
	for _, o := range b.all("HorizontalPodAutoscaler") {
		ref := o.value.(*autoscalingv2.HorizontalPodAutoscaler).Spec.ScaleTargetRef
		if b.get(ref.Kind, ref.Name) == nil {
			t.Errorf("HPA %s scales %s %s, which does not exist", o.name, ref.Kind, ref.Name)
		}
	}
	for _, o := range b.all("ServiceMonitor") {
		checkServiceMonitor(t, b, o.name, o.value.(*monitoringv1.ServiceMonitor))
	}
}

// checkServiceMonitor: it selects Services, each with the ports it scrapes.
func checkServiceMonitor(t *testing.T, b *built, name string, sm *monitoringv1.ServiceMonitor) {
	var matched []string
	for _, o := range b.all("Service") {
		svc := o.value.(*corev1.Service)
		if !matchesSelector(sm.Spec.Selector.MatchLabels, sm.Spec.Selector.MatchExpressions, svc.Labels) {
			continue
		}
		matched = append(matched, o.name)
		for _, ep := range sm.Spec.Endpoints {
			if !servicePort(svc, ep.Port) {
				t.Errorf("ServiceMonitor %s scrapes port %q, which Service %s lacks", name, ep.Port, o.name)
			}
		}
	}
	if len(matched) == 0 {
		t.Errorf("ServiceMonitor %s selects no Service", name)
	}
}

func servicePort(svc *corev1.Service, name string) bool {
	for _, p := range svc.Spec.Ports {
		if p.Name == name {
			return true
		}
	}
	return false
}

func matchesSelector(labels map[string]string, exprs []metav1.LabelSelectorRequirement, of map[string]string) bool {
	for k, v := range labels {
		if of[k] != v {
			return false
		}
	}
	for _, e := range exprs {
		v, ok := of[e.Key]
		switch e.Operator {
		case "In":
			if !ok || !contains(e.Values, v) {
				return false
			}
		case "NotIn":
			if ok && contains(e.Values, v) {
				return false
			}
		case "Exists":
			if !ok {
				return false
			}
		case "DoesNotExist":
			if ok {
				return false
			}
		}
	}
	return len(labels)+len(exprs) > 0
}

func contains(vs []string, v string) bool {
	for _, x := range vs {
		if x == v {
			return true
		}
	}
	return false
}

func hasVolume(spec corev1.PodSpec, name string) bool {
	for _, v := range spec.Volumes {
		if v.Name == name {
			return true
		}
	}
	return false
}

func hasClaim(b *built, w workload, name string) bool {
	if w.kind != "StatefulSet" {
		return false
	}
	for _, o := range b.all("StatefulSet") {
		if o.name != w.name {
			continue
		}
		for _, c := range o.value.(*appsv1.StatefulSet).Spec.VolumeClaimTemplates {
			if c.Name == name {
				return true
			}
		}
	}
	return false
}

// selected returns the workloads whose pods selector selects.
func (b *built) selected(selector map[string]string) []workload {
	var out []workload
	for _, w := range b.workloads() {
		if selects(selector, w.pod.Labels) {
			out = append(out, w)
		}
	}
	return out
}

func (b *built) workload(name string) workload {
	for _, w := range b.workloads() {
		if w.name == name {
			return w
		}
	}
	return workload{}
}

func serviceNameOf(b *built, statefulSet string) string {
	if s, ok := b.get("StatefulSet", statefulSet).(*appsv1.StatefulSet); ok {
		return s.Spec.ServiceName
	}
	return ""
}

func anyContainerPort(ws []workload, port string) bool {
	for _, w := range ws {
		for _, c := range w.pod.Spec.Containers {
			for _, p := range c.Ports {
				if p.Name == port || itoa(p.ContainerPort) == port {
					return true
				}
			}
		}
	}
	return false
}

// Every container has CPU and memory requests and limits, its CPU
// request equal to its limit (the cgroup's cpu.max, which triage's CPU
// signal reads, is then what the scheduler reserved, and the HPA's CPU
// utilization is measured against the same), and runs without root,
// privilege escalation or a writable root filesystem.
func checkResources(t *testing.T, b *built) {
	for _, w := range b.workloads() {
		sc := w.pod.Spec.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("%s: the pod does not set runAsNonRoot", w.name)
		}
		for _, c := range w.pod.Spec.Containers {
			r := c.Resources
			for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if r.Requests.Name(res, "").IsZero() || r.Limits.Name(res, "").IsZero() {
					t.Errorf("%s/%s: no %s request and limit", w.name, c.Name, res)
				}
			}
			if !r.Requests.Cpu().Equal(*r.Limits.Cpu()) {
				t.Errorf("%s/%s: CPU request %v, limit %v: want them equal", w.name, c.Name, r.Requests.Cpu(), r.Limits.Cpu())
			}
			s := c.SecurityContext
			if s == nil || s.AllowPrivilegeEscalation == nil || *s.AllowPrivilegeEscalation || s.ReadOnlyRootFilesystem == nil || !*s.ReadOnlyRootFilesystem {
				t.Errorf("%s/%s: want allowPrivilegeEscalation false and readOnlyRootFilesystem true", w.name, c.Name)
			}
		}
	}
}
