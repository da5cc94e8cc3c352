package testenv

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes cmd's process receive SIGKILL when the process that
// started it dies, so a test or benchmark killed abruptly (a timeout, a
// closed pipe) leaves no server behind. Linux only, like this project's CI.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
