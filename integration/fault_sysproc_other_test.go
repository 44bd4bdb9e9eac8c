//go:build !linux

package integration

import "syscall"

// faultSysProcAttr has nothing to add where Pdeathsig does not exist; the
// test's cleanup still kills every server it started.
func faultSysProcAttr() *syscall.SysProcAttr { return nil }
