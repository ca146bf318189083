package reliability

import "syscall"

// chaosSysProcAttr makes the kernel kill a child when the test process dies, so that a crashed or
// killed test leaves no relay or writer behind.
func chaosSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
