// Package grantlog is the quota service's grant log: one JSON line per
// share of a customer's limit granted to a task (`triage quota-server
// -grant-log`), and MaxHeld, which checks from the logs of every replica
// that the shares tasks could hold at once never sum past a bound.
package grantlog

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
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

// QueueLen is how many leases a Writer holds waiting to be written; one
// more is dropped and counted (Writer.Stats).
const QueueLen = 4096

// Writer writes Records as JSON lines off its callers' goroutines: Lease
// queues a lease without blocking (at most QueueLen wait; past that it is
// dropped and counted), and Run writes them, buffered, flushing whenever
// the queue empties. A write error is counted, kept (Err) and reported to
// the onError func when it follows a success, so that a full disk shows
// in the metrics and the log rather than silently ending the trail. It is
// safe for concurrent use; its memory is bounded by QueueLen leases.
type Writer struct {
	q       chan pending
	under   io.Writer
	out     *bufio.Writer
	unsent  uint64 // records in out not yet flushed; Run's
	replica string
	now     func() time.Time
	onError func(error)
	failing bool // the last write or flush failed; Run's

	written, dropped, failed atomic.Uint64
	mu                       sync.Mutex
	err                      error
}

type pending struct {
	at   time.Time
	task string
	ls   quota.Lease
}

// NewWriter returns a Writer to w for the replica named replica, dating
// records with now and telling onError (nil: nobody) of write errors.
// Nothing is written until Run.
func NewWriter(w io.Writer, replica string, now func() time.Time, onError func(error)) *Writer {
	return &Writer{q: make(chan pending, QueueLen), under: w, out: bufio.NewWriterSize(w, 64<<10), replica: replica, now: now, onError: onError}
}

// Lease queues a record for every named grant of ls (the Default grant is
// not a share of a named limit), dated now. It does not block: a lease
// the queue has no room for is dropped and counted.
func (w *Writer) Lease(task string, ls quota.Lease) {
	if len(ls.Grants) == 0 {
		return
	}
	select {
	case w.q <- pending{at: w.now(), task: task, ls: ls}:
	default:
		w.dropped.Add(1)
	}
}

// Run writes the queued leases until ctx is done, then those still queued,
// flushes, and returns.
func (w *Writer) Run(ctx context.Context) {
	for {
		select {
		case p := <-w.q:
			w.write(p)
			if len(w.q) == 0 {
				w.flush()
			}
		case <-ctx.Done():
			for {
				select {
				case p := <-w.q:
					w.write(p)
					continue
				default:
				}
				break
			}
			w.flush()
			return
		}
	}
}

func (w *Writer) write(p pending) {
	for _, g := range p.ls.Grants {
		b, err := json.Marshal(Record{At: p.at, Replica: w.replica, Task: p.task, Customer: g.Customer, Share: g.Share, Lease: p.ls.Duration})
		if err != nil {
			w.fail(1, err)
			continue
		}
		if w.out.Available() < len(b)+1 {
			w.flush()
		}
		w.out.Write(b)
		w.out.WriteByte('\n')
		w.unsent++
	}
}

// flush writes out the buffered records. On an error they are lost and
// counted, and the buffer starts again (a bufio.Writer keeps its first
// error for good): once the disk has room, the log goes on.
func (w *Writer) flush() {
	n := w.unsent
	w.unsent = 0
	if err := w.out.Flush(); err != nil {
		w.out.Reset(w.under)
		w.fail(n, err)
		return
	}
	w.written.Add(n)
	w.failing = false
}

// fail counts n records lost to err, keeps the first error, and reports
// err if the last write succeeded; Run's goroutine.
func (w *Writer) fail(n uint64, err error) {
	w.failed.Add(n)
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	if !w.failing && w.onError != nil {
		w.onError(err)
	}
	w.failing = true
}

// Err returns the first write error.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Stats returns how many records were written, leases dropped for want
// of room in the queue, and records lost to write errors.
func (w *Writer) Stats() (written, dropped, failed uint64) {
	return w.written.Load(), w.dropped.Load(), w.failed.Load()
}

// File is a log file rotated by size: once a write would take it past
// its maximum, it is renamed NAME.1 (NAME.1 to NAME.2, and so on, the
// oldest past the backups kept removed) and a new one started. It is not
// safe for concurrent use (a Writer's Run is its one writer).
type File struct {
	path    string
	max     int64
	backups int
	f       *os.File
	size    int64
}

// OpenFile opens path for appending, to be rotated past maxBytes (at
// least 4 KiB), keeping backups older files (0 to 100).
func OpenFile(path string, maxBytes int64, backups int) (*File, error) {
	if maxBytes < 4<<10 || backups < 0 || backups > 100 {
		return nil, fmt.Errorf("grantlog: need a maximum size of at least 4 KiB and 0 to 100 backups, got %d bytes, %d", maxBytes, backups)
	}
	l := &File{path: path, max: maxBytes, backups: backups}
	return l, l.open()
}

func (l *File) open() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	l.f, l.size = f, fi.Size()
	return nil
}

// Write writes p, rotating first if p would take the file past its
// maximum.
func (l *File) Write(p []byte) (int, error) {
	if l.f == nil {
		if err := l.open(); err != nil {
			return 0, err
		}
	}
	if l.size > 0 && l.size+int64(len(p)) > l.max {
		if err := l.rotate(); err != nil {
			return 0, err
		}
	}
	n, err := l.f.Write(p)
	l.size += int64(n)
	return n, err
}

func (l *File) rotate() error {
	if err := l.f.Close(); err != nil {
		return err
	}
	l.f = nil
	if l.backups == 0 {
		if err := os.Remove(l.path); err != nil {
			return err
		}
		return l.open()
	}
	os.Remove(fmt.Sprintf("%s.%d", l.path, l.backups))
	for i := l.backups - 1; i >= 1; i-- {
		if err := os.Rename(fmt.Sprintf("%s.%d", l.path, i), fmt.Sprintf("%s.%d", l.path, i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := os.Rename(l.path, l.path+".1"); err != nil {
		return err
	}
	return l.open()
}

// Close closes the file.
func (l *File) Close() error {
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
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
