// Package proc reads this process's resource usage for the core packages
// (admission's CPU signal, cost's estimator).
package proc

import "errors"

// ErrUnsupported is returned where the platform cannot report the
// process's CPU time.
var ErrUnsupported = errors.New("process CPU time is not available on this platform")
