//go:build !unix

package admission

import "time"

func processCPU() (time.Duration, error) { return 0, errUnsupported() }
