package campaign

import "syscall"

// sysProcAttr makes a started process die with the campaign's process, so
// that a campaign killed by a timeout leaves no server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
