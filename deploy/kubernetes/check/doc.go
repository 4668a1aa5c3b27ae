// Package check verifies triage's Kubernetes kit (deploy/kubernetes)
// without a cluster; it has no code, only tests, in a module of its own
// so that the library's users never download the Kubernetes API types.
//
// go test builds each overlay with `kubectl kustomize` (Debian's
// kubernetes-client; the tests fail without it), with throwaway
// certificates from cmd/devcerts, decodes every object strictly into the
// Kubernetes API types (k8s.io/api) and the Prometheus Operator's, and
// checks what can be checked without a cluster: the triage containers'
// arguments parse as their commands' flags, their probes are the paths
// and ports the commands answer, the grace period outlasts the drain and
// the stop, every Secret, ConfigMap, Service, ServiceAccount and
// workload referenced exists and every selector selects, the HPA's metric
// is one triage's rules record, the PrometheusRule is the rules file
// promtool passes, the dashboard is the repository's, and the
// Dockerfile builds a static binary run as a non-root user.
package check
