// Command pause is the sandbox ("pause") container of the real-node tests: it holds a pod's
// namespaces and waits until the kubelet stops the sandbox. No pause image can be pulled on a
// test machine, so e2e/node/install.sh builds this one (static, CGO_ENABLED=0) and packs it
// with images/image.sh.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
