//go:build !unix

package proc

import "time"

func CPU() (time.Duration, error) { return 0, ErrUnsupported }
