package proc

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// taskDir holds a directory per thread of this process, each with a
// schedstat file (Linux: "cpu-time run-delay timeslices", in ns).
const taskDir = "/proc/self/task"

// RunQueueWait returns the time this process's live threads have spent
// runnable but waiting for a CPU that the kernel gave to something else
// (the second field of each thread's schedstat), or ErrUnsupported where
// the kernel does not report it. A thread that exits takes its share with
// it, so the sum can go down: callers take differences and clamp them.
func RunQueueWait() (time.Duration, error) {
	entries, err := os.ReadDir(taskDir)
	if err != nil {
		return 0, ErrUnsupported
	}
	var total int64
	var buf [128]byte
	read := 0
	for _, e := range entries {
		f, err := os.Open(taskDir + "/" + e.Name() + "/schedstat")
		if err != nil {
			continue // the thread exited
		}
		n, _ := f.Read(buf[:])
		f.Close()
		if d, ok := ParseRunDelay(buf[:n]); ok {
			total += d
			read++
		}
	}
	if read == 0 {
		return 0, ErrUnsupported
	}
	return time.Duration(total), nil
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
