package grantlog

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/quota"
)

func TestMaxHeld(t *testing.T) {
	t0 := time.Unix(100, 0)
	var buf bytes.Buffer
	now := t0
	w := NewWriter(&buf, "r1", func() time.Time { return now }, nil)
	lease := func(share float64) quota.Lease {
		return quota.Lease{Grants: []quota.Grant{{Customer: "a", Share: share}}, Duration: 5 * time.Second}
	}
	w.Lease("x", lease(0.6))
	w.Lease("y", lease(0.4))
	now = t0.Add(time.Second)
	w.Lease("x", lease(0.3)) // x gives back before y is raised
	now = t0.Add(2 * time.Second)
	w.Lease("y", lease(0.7))
	now = t0.Add(8 * time.Second) // x's last lease ran out at 6 s
	w.Lease("z", lease(0.3))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w.Run(ctx) // writes what is queued, then returns
	recs, err := Read(&buf, 100)
	if err != nil || len(recs) != 5 {
		t.Fatalf("read %d records: %v", len(recs), err)
	}
	got := MaxHeld(recs, 100*time.Millisecond)["a"]
	if math.Abs(got.Sum-1) > 1e-9 {
		t.Errorf("peak %.3f at %v, want 1.0", got.Sum, got.At.Sub(t0))
	}
	// y raised before x gave back: 1.3 at once.
	recs[2].At, recs[3].At = recs[3].At, recs[2].At
	if got := MaxHeld(recs, 0)["a"]; math.Abs(got.Sum-1.3) > 1e-9 {
		t.Errorf("peak %.3f, want 1.3", got.Sum)
	}
	if _, err := Read(bytes.NewBufferString("{}\nnot json\n"), 10); err == nil {
		t.Error("a line that is not JSON was read")
	}
}

// failingWriter fails every write while full, as a full disk does.
type failingWriter struct {
	full bool
	buf  bytes.Buffer
}

var errDiskFull = errors.New("no space left on device")

func (f *failingWriter) Write(p []byte) (int, error) {
	if f.full {
		return 0, errDiskFull
	}
	return f.buf.Write(p)
}

// Issue 38: the grant log never blocks the refresh path (a full queue
// drops and counts), and a failing disk is counted and reported once per
// spell of failures, not silently.
func TestWriterNeverBlocksAndReportsErrors(t *testing.T) {
	var reported []error
	disk := &failingWriter{full: true}
	w := NewWriter(disk, "r1", time.Now, func(err error) { reported = append(reported, err) })
	lease := quota.Lease{Grants: []quota.Grant{{Customer: "a", Share: 0.5}}, Duration: time.Second}
	for range QueueLen + 10 { // nothing writes yet: the queue fills
		w.Lease("x", lease)
	}
	if _, dropped, _ := w.Stats(); dropped != 10 {
		t.Fatalf("%d leases past a full queue: %d dropped, want 10", QueueLen+10, dropped)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w.Run(ctx)
	written, _, failed := w.Stats()
	if written != 0 || failed == 0 || !errors.Is(w.Err(), errDiskFull) {
		t.Fatalf("on a full disk: %d written, %d failed, Err %v", written, failed, w.Err())
	}
	if len(reported) != 1 || !errors.Is(reported[0], errDiskFull) {
		t.Fatalf("reported %v, want the error once", reported)
	}
	disk.full = false // room again: the log goes on
	w.Lease("y", lease)
	w.Run(ctx)
	if written, _, _ := w.Stats(); written != 1 || !strings.Contains(disk.buf.String(), `"task":"y"`) {
		t.Fatalf("after the disk has room: %d written, %q", written, disk.buf.String())
	}
}

// Issue 38: the grant log rotates by size and keeps its backups.
func TestFileRotatesBySize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "grants.log")
	f, err := OpenFile(path, 4<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	line := strings.Repeat("x", 1023) + "\n"
	for range 20 { // 20 KiB through a 4 KiB file
		if _, err := f.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{path, path + ".1", path + ".2"} {
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > 4<<10 || fi.Size() == 0 {
			t.Errorf("%s: %d bytes, want 1 to 4096", filepath.Base(name), fi.Size())
		}
	}
	if _, err := os.Stat(path + ".3"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a third backup kept (%v), want two", err)
	}
	if _, err := OpenFile(path, 100, 2); err == nil {
		t.Error("a maximum of 100 bytes accepted")
	}
}
