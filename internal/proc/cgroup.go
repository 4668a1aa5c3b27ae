package proc

import (
	"math"
	"os"
	"strconv"
	"strings"
)

// The cgroup v2 files this process's limits are read from.
const (
	cgroupCPUMax    = "/sys/fs/cgroup/cpu.max"
	cgroupMemoryMax = "/sys/fs/cgroup/memory.max"
)

// CgroupCPUs returns the CPUs the process's cgroup v2 cpu.max quota
// allows (quota / period), and false when no quota is set or the file
// cannot be read.
func CgroupCPUs() (float64, bool) {
	b, err := os.ReadFile(cgroupCPUMax)
	if err != nil {
		return 0, false
	}
	return ParseCPUMax(string(b))
}

// ParseCPUMax reads cgroup v2 cpu.max ("max 100000" or "150000 100000")
// as a number of CPUs; "max" and malformed values give false.
func ParseCPUMax(s string) (float64, bool) {
	f := strings.Fields(s)
	if len(f) != 2 || f[0] == "max" {
		return 0, false
	}
	q, err1 := strconv.ParseFloat(f[0], 64)
	p, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || !(q > 0) || !(p > 0) || math.IsInf(q, 0) || math.IsInf(p, 0) {
		return 0, false
	}
	return q / p, true
}

// CgroupMemory returns the process's cgroup v2 memory.max in bytes, and
// false when none is set ("max") or the file cannot be read.
func CgroupMemory() (uint64, bool) {
	b, err := os.ReadFile(cgroupMemoryMax)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return v, err == nil && v > 0
}
