package triageotel

// names maps each series triageprom exports to the instrument that
// reports it here with the same meaning; a label l is the attribute l.
var names = map[string]string{
	"triage_edge_requests_total":                "triage.edge.requests",
	"triage_edge_invalid_header_total":          "triage.edge.invalid_header",
	"triage_untrusted_keys_stripped_total":      "triage.untrusted_keys_stripped",
	"triage_admission_admitted_total":           "triage.admission.admitted",
	"triage_admission_rejected_total":           "triage.admission.rejected",
	"triage_admission_degraded_total":           "triage.admission.degraded",
	"triage_admission_limit":                    "triage.admission.limit",
	"triage_admission_pending":                  "triage.admission.pending",
	"triage_admission_pending_cap":              "triage.admission.pending_cap",
	"triage_admission_executing":                "triage.admission.executing",
	"triage_admission_queued":                   "triage.admission.queued",
	"triage_admission_away":                     "triage.admission.away",
	"triage_admission_stalled":                  "triage.admission.stalled",
	"triage_admission_service_seconds":          "triage.admission.service",
	"triage_admission_retry_ratio":              "triage.admission.retry_ratio",
	"triage_admission_signal_ratio":             "triage.admission.signal_ratio",
	"triage_admission_forced_shed_ratio":        "triage.admission.forced_shed_ratio",
	"triage_admission_attempts_total":           "triage.admission.attempts",
	"triage_admission_wait_seconds":             "triage.admission.wait", // a histogram in both: compared by count
	"triage_client_requests_total":              "triage.client.requests",
	"triage_client_accepts_total":               "triage.client.accepts",
	"triage_client_backend_rejections_total":    "triage.client.backend_rejections",
	"triage_client_throttled_total":             "triage.client.throttled",
	"triage_client_retries_total":               "triage.client.retries",
	"triage_client_retry_budget_refusals_total": "triage.client.retry_budget_refusals",
	"triage_client_attempts_exhausted_total":    "triage.client.attempts_exhausted",
	"triage_shadow_would_refuse_total":          "triage.shadow.would_refuse",
	"triage_quota_usage_cpu":                    "triage.quota.usage_cpu",
	"triage_quota_limit_cpu":                    "triage.quota.limit_cpu",
	"triage_quota_demand_cpu":                   "triage.quota.demand_cpu",
	"triage_quota_customer_refused_total":       "triage.quota.customer_refused",
	"triage_quota_refused_total":                "triage.quota.refused",
	"triage_quota_threshold":                    "triage.quota.threshold",
	"triage_quota_overloaded":                   "triage.quota.overloaded",
	"triage_quota_lease_age_seconds":            "triage.quota.lease.age",
	"triage_quota_lease_valid":                  "triage.quota.lease.valid",
	"triage_quota_global_usage_cpu":             "triage.quota.global.usage_cpu",
	"triage_quota_global_demand_cpu":            "triage.quota.global.demand_cpu",
	"triage_quota_global_limit_cpu":             "triage.quota.global.limit_cpu",
	"triage_quota_tasks":                        "triage.quota.tasks",
	"triage_quota_refreshes_total":              "triage.quota.refreshes",
	"triage_quota_task_refresh_age_max_seconds": "triage.quota.task.refresh_age_max",
	"triage_quota_leader":                       "triage.quota.leader",
	"triage_quota_granting":                     "triage.quota.granting",
	"triage_quota_elections_total":              "triage.quota.elections",
	"triage_quota_policy_version":               "triage.quota.policy_version",
	"triage_balancer_picks_total":               "triage.balancer.picks",
	"triage_balancer_active_requests":           "triage.balancer.active_requests",
	"triage_balancer_weight":                    "triage.balancer.weight",
	"triage_balancer_backend_state":             "triage.balancer.backend_state",
	"triage_balancer_state_changes_total":       "triage.balancer.state_changes",
	"triage_connections_open":                   "triage.connections.open",
	"triage_connections_accepted_total":         "triage.connections.accepted",
	"triage_connections_delayed_total":          "triage.connections.delayed",
	"triage_connections_busy":                   "triage.connections.busy",
	"triage_health_checks_total":                "triage.health_checks",
	"triage_slow_sender_refusals_total":         "triage.slow_sender.refusals",
}

// Names returns, for each series triageprom exports, the name of the
// instrument that reports it here, a label l being the attribute l.
// Through a Prometheus exporter the instrument becomes that series; the
// map serves a backend that keeps OpenTelemetry's names.
func Names() map[string]string {
	out := make(map[string]string, len(names))
	for k, v := range names {
		out[k] = v
	}
	return out
}
