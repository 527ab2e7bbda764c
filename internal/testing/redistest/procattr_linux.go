package redistest

import "syscall"

// sysProcAttr makes the kernel kill redis-server if the test binary dies
// without running its cleanups (a panic or a -timeout abort), so no
// orphaned servers outlive the test run.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
