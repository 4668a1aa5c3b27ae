//go:build unix

package app

import (
	"os"
	"syscall"
)

// reexec replaces the process with this program run again with args (the
// command's, without the program's name) and env; it returns only if it
// could not.
func reexec(args, env []string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	return syscall.Exec(self, append([]string{os.Args[0]}, args...), env)
}
