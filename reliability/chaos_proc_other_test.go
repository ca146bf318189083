//go:build !linux

package reliability

import "syscall"

// chaosSysProcAttr has nothing to add outside Linux: a child stops when its standard input closes,
// which happens when the test process dies.
func chaosSysProcAttr() *syscall.SysProcAttr { return nil }
