package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"

	"google.golang.org/grpc/codes"
)

func printTable(w io.Writer, rep report) {
	fmt.Fprintf(w, "capacity C = %.0f req/s at cost %.2f ms (one backend CPU; the first probe: with --reprobe each load step's goodput is against its own C_step)\n\n", rep.CapacityRPS, rep.CostMS)
	if rep.Recovery != nil {
		b, _ := json.MarshalIndent(rep.Recovery, "", "  ")
		fmt.Fprintln(w, string(b))
		return
	}
	fmt.Fprintf(w, "%-17s %5s %8s %8s %8s %8s %8s %6s %s\n", "VARIANT", "LOAD", "GOODPUT", "P50ms", "P99ms", "RSS_MB", "SURVIVED", "VALID", "NOTES")
	res := append([]result(nil), rep.Results...)
	sort.SliceStable(res, func(i, j int) bool {
		if (res[i].Workers > 0) != (res[j].Workers > 0) {
			return res[j].Workers > 0
		}
		return res[i].Load < res[j].Load
	})
	for _, r := range res {
		notes := fmt.Sprintf("generator_cpu=%.2f sent=%d completed=%d late_sends=%d (%.2f%%) max_lag=%.0fms over_deadline_max=%.0fms untriaged_failures=%d goroutines=%d->%d",
			r.GeneratorCPU, r.Sent, r.Completed, r.LateSends, 100*float64(r.LateSends)/float64(max(r.Sent, 1)), r.MaxLagMS, r.MaxOverMS, r.Untriaged, r.Goroutines[0], r.Goroutines[1])
		if r.StepCapacityRPS > 0 {
			notes = fmt.Sprintf("C_step=%.0f ", r.StepCapacityRPS) + notes
		}
		if r.VsOracle > 0 {
			notes = fmt.Sprintf("vs_oracle=%.2f ", r.VsOracle) + notes
		}
		if len(r.ByCriticality) > 0 {
			notes += fmt.Sprintf(" by_criticality=%v", r.ByCriticality)
		}
		if len(r.Retries) > 0 {
			notes += fmt.Sprintf(" retries=%v (second half %v)", r.Retries, r.RetriesLate)
		}
		load := fmt.Sprintf("%.1f", r.Load)
		if r.Workers > 0 {
			load = fmt.Sprintf("%gx/%dw", r.Load, r.Workers)
		}
		fmt.Fprintf(w, "%-17s %5s %8.2f %8.1f %8.1f %8.1f %8v %6v %s\n", r.Variant, load, r.Goodput, r.P50ms, r.P99ms, r.PeakRSSMB, r.Survived, r.Valid, notes)
	}
	_ = codes.OK
}
