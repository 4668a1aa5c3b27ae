package check

import (
	"fmt"
	"strings"
	"testing"
)

// componentSecrets are the TLS Secrets each component mounts: name ->
// the certs/ directory and the CA file devcerts writes for it.
var componentSecrets = map[string][][2]string{
	"shop":  {{"shop-tls", "shop"}},
	"quota": {{"quota-tls", "quota"}, {"quota-etcd-client-tls", "quota-etcd-client"}},
	"etcd":  {{"etcd-tls", "etcd"}},
}

// Each component can be left out: the base with some of them builds, and
// what it builds passes the checks that apply to what is there (every
// reference resolves, every workload has its NetworkPolicy, resources,
// pinned images, flags its command accepts).
func TestComponentsAreOptional(t *testing.T) {
	// etcd alone serves nothing: it is there for the quota service.
	for _, set := range [][]string{{"shop"}, {"etcd", "quota"}} {
		t.Run(strings.Join(set, "+"), func(t *testing.T) {
			var k strings.Builder
			k.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: triage\nresources:\n  - ../../base\ncomponents:\n")
			for _, c := range set {
				fmt.Fprintf(&k, "  - ../../components/%s\n", c)
			}
			k.WriteString("secretGenerator:\n")
			for _, c := range set {
				for _, s := range componentSecrets[c] {
					ca := "ca.crt"
					if strings.Contains(s[1], "etcd") {
						ca = "etcd-ca.crt"
					}
					fmt.Fprintf(&k, "  - name: %s\n    type: kubernetes.io/tls\n    files:\n      - tls.crt=certs/%s/tls.crt\n      - tls.key=certs/%s/tls.key\n      - ca.crt=certs/%s\n", s[0], s[1], s[1], ca)
				}
			}
			b := buildWith(t, "only", "triage", k.String())
			workloads := map[string]bool{}
			for _, w := range b.workloads() {
				workloads[w.name] = true
			}
			for _, c := range set {
				if !workloads[c] {
					t.Errorf("component %s: no workload %s in the build", c, c)
				}
			}
			if len(workloads) != len(set) {
				t.Errorf("workloads %v, want those of %v only", workloads, set)
			}
			for _, c := range []func(*testing.T, *built){checkReferences, checkNetworkPolicies, checkResources, checkImages, checkFlags, checkProbes} {
				c(t, b)
			}
		})
	}
}
