// Command kube-testbins is a multi-call binary (hyperkube style) holding the
// parts of a real Kubernetes control plane that Scale Agent's tests and demo
// run: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
// kubectl, and the node components of the real-node tests, kubelet and
// kube-proxy. Linking them into one binary compiles and links the shared
// Kubernetes dependencies once, which roughly halves the cold build on a
// 2-core machine.
//
// The component is chosen by the name the binary is invoked under (build.sh
// creates one symlink per component), or by the first argument:
//
//	kube-apiserver --etcd-servers=...
//	kube-testbins kube-apiserver --etcd-servers=...
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	_ "time/tzdata"

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var components = map[string]func() int{
	"etcd": func() int {
		etcdmain.Main(os.Args)
		return 0
	},
	"kube-apiserver": func() int {
		return cli.Run(apiserver.NewAPIServerCommand())
	},
	"kube-controller-manager": func() int {
		return cli.Run(controllermanager.NewControllerManagerCommand())
	},
	"kube-scheduler": func() int {
		return cli.Run(scheduler.NewSchedulerCommand())
	},
	"kubelet": func() int {
		// NewKubeletCommand takes the context its servers run under since 1.37; a nil
		// one panics at start. The kubelet handles SIGTERM itself.
		return cli.Run(kubelet.NewKubeletCommand(context.Background()))
	},
	"kube-proxy": func() int {
		return cli.Run(proxy.NewProxyCommand())
	},
	"kubectl": func() int {
		if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return 0
	},
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := components[name]; !ok && len(os.Args) > 1 {
		// Invoked as `kube-testbins <component> args...`: shift the component
		// name into argv[0] so each command parses its own flags as usual.
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	run, ok := components[name]
	if !ok {
		names := make([]string, 0, len(components))
		for n := range components {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "kube-testbins: unknown component %q; invoke as one of %v\n", name, names)
		os.Exit(2)
	}
	os.Exit(run())
}
