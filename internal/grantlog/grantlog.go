// Package grantlog is the quota service's grant log: one JSON line per
// share of a customer's limit granted to a task (`triage quota-server
// -grant-log`), and MaxHeld, which checks from the logs of every replica
// that the shares tasks could hold at once never sum past a bound.
package grantlog

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/triagehq/triage/quota"
)

// Record is one grant: Task may enforce Share of Customer's limit from At
// until At+Lease, or until its next grant.
type Record struct {
	At       time.Time     `json:"at"`
	Replica  string        `json:"replica"`
	Task     string        `json:"task"`
	Customer string        `json:"customer"`
	Share    float64       `json:"share"`
	Lease    time.Duration `json:"lease_ns"`
}

// Writer writes Records as JSON lines; it is safe for concurrent use.
type Writer struct {
	mu      sync.Mutex
	enc     *json.Encoder
	replica string
	now     func() time.Time
	err     error
}

// NewWriter returns a Writer to w for the replica named replica, dating
// records with now.
func NewWriter(w io.Writer, replica string, now func() time.Time) *Writer {
	return &Writer{enc: json.NewEncoder(w), replica: replica, now: now}
}

// Lease writes a record for every named grant of ls (the Default grant is
// not a share of a named limit).
func (w *Writer) Lease(task string, ls quota.Lease) {
	at := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, g := range ls.Grants {
		if err := w.enc.Encode(Record{At: at, Replica: w.replica, Task: task, Customer: g.Customer, Share: g.Share, Lease: ls.Duration}); err != nil && w.err == nil {
			w.err = err
		}
	}
}

// Err returns the first write error.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Read reads the records of one log; at most max of them.
func Read(r io.Reader, max int) ([]Record, error) {
	var out []Record
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if len(out) >= max {
			return out, fmt.Errorf("grantlog: more than %d records", max)
		}
		var rec Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return out, fmt.Errorf("grantlog: line %d: %v", len(out)+1, err)
		}
		out = append(out, rec)
	}
	return out, sc.Err()
}

// Peak is the most the tasks could hold of one customer's limit at once.
type Peak struct {
	Sum float64
	At  time.Time
}

// MaxHeld returns, per customer, the largest sum of the shares the tasks
// could enforce at the same moment, over the records of every replica: a
// grant counts from its time until its lease ends, plus slack (for the
// grant's way to the task), or until the task's next grant of that
// customer if sooner. It takes time quadratic in a customer's records:
// for logs of test runs.
func MaxHeld(records []Record, slack time.Duration) map[string]Peak {
	type key struct{ task, customer string }
	byKey := map[key][]Record{}
	for _, r := range records {
		k := key{r.Task, r.Customer}
		byKey[k] = append(byKey[k], r)
	}
	type interval struct {
		from, to time.Time
		share    float64
	}
	per := map[string][]interval{}
	for k, rs := range byKey {
		slices.SortFunc(rs, func(a, b Record) int { return a.At.Compare(b.At) })
		for i, r := range rs {
			end := r.At.Add(r.Lease + slack)
			if i+1 < len(rs) && rs[i+1].At.Before(end) {
				end = rs[i+1].At
			}
			per[k.customer] = append(per[k.customer], interval{r.At, end, r.Share})
		}
	}
	out := map[string]Peak{}
	for c, ivs := range per {
		var best Peak
		for _, at := range ivs { // the sum only rises where an interval starts
			sum := 0.0
			for _, iv := range ivs {
				if !at.from.Before(iv.from) && at.from.Before(iv.to) {
					sum += iv.share
				}
			}
			if sum > best.Sum {
				best = Peak{sum, at.from}
			}
		}
		out[c] = best
	}
	return out
}
