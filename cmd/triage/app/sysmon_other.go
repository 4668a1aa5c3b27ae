//go:build !unix

package app

import "errors"

// reexec is not available here: the command runs with the environment it
// was given.
func reexec(args, env []string) error {
	return errors.New("re-executing is not supported on this system")
}
