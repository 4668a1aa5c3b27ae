package proc

import (
	"bytes"
	"os"
	"strconv"
	"sync"
	"time"
)

// taskDir holds a directory per thread of this process, each with a
// schedstat file (Linux: "cpu-time run-delay timeslices", in ns).
const taskDir = "/proc/self/task"

// relistEvery is how many readings a RunQueueWaiter takes between two
// listings of the process's threads: a thread started since is counted
// from the next listing on (Go starts threads rarely, and keeps them).
const relistEvery = 16

// RunQueueWaiter reads the time this process's live threads have spent
// runnable but waiting for a CPU that the kernel gave to something else
// (the second field of each thread's schedstat). It keeps each thread's
// file open between readings and lists the threads again every 16
// readings, so a reading is one pread per thread. It holds one open file
// per thread of the process. Its zero value is ready to use, and it is
// safe for concurrent use.
type RunQueueWaiter struct {
	mu    sync.Mutex
	files []*os.File
	reads int
	buf   [128]byte
}

// Read returns the threads' run-queue wait so far, or ErrUnsupported where
// the kernel does not report it. A thread that exits takes its share with
// it, so the sum can go down: callers take differences and clamp them.
func (w *RunQueueWaiter) Read() (time.Duration, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.reads%relistEvery == 0 {
		w.relist()
	}
	w.reads++
	var total int64
	read := 0
	for _, f := range w.files {
		n, _ := f.ReadAt(w.buf[:], 0)
		if d, ok := ParseRunDelay(w.buf[:n]); ok {
			total += d
			read++
		}
	}
	if read == 0 {
		return 0, ErrUnsupported
	}
	return time.Duration(total), nil
}

// relist opens the schedstat of every thread of the process now, and
// closes the files of the last listing. w.mu is held.
func (w *RunQueueWaiter) relist() {
	for _, f := range w.files {
		f.Close()
	}
	w.files = w.files[:0]
	entries, err := os.ReadDir(taskDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if f, err := os.Open(taskDir + "/" + e.Name() + "/schedstat"); err == nil {
			w.files = append(w.files, f)
		}
	}
}

// ParseRunDelay reads the run delay (ns), the second of schedstat's three
// fields; false for anything else.
func ParseRunDelay(b []byte) (int64, bool) {
	f := bytes.Fields(b)
	if len(f) != 3 {
		return 0, false
	}
	v, err := strconv.ParseInt(string(f[1]), 10, 64)
	return v, err == nil && v >= 0
}
