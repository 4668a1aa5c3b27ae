package main

import (
	"encoding/json"
	"testing"
	"time"
)

func TestEndedWithinCountsCallsByWhenTheyEnded(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC)
	report := `{"details":[
		{"timestamp":"2026-11-27T03:00:00.5Z","latency":400000000,"status":"OK"},
		{"timestamp":"2026-11-27T03:00:00.5Z","latency":600000000,"status":"OK"},
		{"timestamp":"2026-11-27T03:00:01.2Z","latency":1000000,"status":"Unavailable"},
		{"timestamp":"2026-11-27T03:00:02.5Z","latency":1000000000,"status":"DeadlineExceeded"},
		{"timestamp":"2026-11-27T03:00:02.9Z","latency":50000000,"status":"OK"}
	]}`
	var rep ghzReport
	if err := json.Unmarshal([]byte(report), &rep); err != nil {
		t.Fatal(err)
	}
	// The window [1 s, 3 s): the first call ended at 0.9 s, before it; the
	// fourth at 3.5 s, after it.
	ok, other := rep.endedWithin(window{from: t0.Add(time.Second), to: t0.Add(3 * time.Second)})
	if ok != 1 || other != 0.5 {
		t.Fatalf("endedWithin = %v OK/s, %v others/s; want 1 (two OK calls in 2 s) and 0.5 (one refusal)", ok, other)
	}
}
