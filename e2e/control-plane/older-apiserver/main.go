// Command kube-older is a multi-call binary holding kube-apiserver,
// kube-controller-manager and kube-scheduler of an older Kubernetes release (the one pinned in
// ../older-kubernetes-version), for testing the operator and the agent
// against a target cluster still in a major cloud's support window. etcd,
// kubectl and the rest come from the main build (testbins/main.go): the same
// etcd serves every API server release, and the controller manager and the
// scheduler (for KWOK's fake nodes) are this release's because newer ones use
// APIs the older server lacks (the version skew policy: never newer than the
// API server).
//
// The component is chosen by the name the binary is invoked under (build.sh
// creates one symlink per component), or by the first argument.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var components = map[string]func() int{
	"kube-apiserver": func() int {
		return cli.Run(apiserver.NewAPIServerCommand())
	},
	"kube-controller-manager": func() int {
		return cli.Run(controllermanager.NewControllerManagerCommand())
	},
	"kube-scheduler": func() int {
		return cli.Run(scheduler.NewSchedulerCommand())
	},
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := components[name]; !ok && len(os.Args) > 1 {
		// Invoked as `kube-older <component> args...`: shift the component name
		// into argv[0] so each command parses its own flags as usual.
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	run, ok := components[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "kube-older: unknown component %q; invoke as kube-apiserver, kube-controller-manager or kube-scheduler\n", name)
		os.Exit(2)
	}
	os.Exit(run())
}
