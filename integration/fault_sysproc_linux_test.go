package integration

import "syscall"

// faultSysProcAttr makes a started server die with the test binary, so
// that a test killed by a timeout leaves no server behind.
func faultSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
