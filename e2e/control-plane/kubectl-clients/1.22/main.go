// Command kubectl is kubectl v1.22 as Kubernetes v1.22's cmd/kubectl/kubectl.go
// builds it, for testing that older clients (Spinnaker's Clouddriver ships
// kubectl 1.22 to 1.29) work through Scale Agent. That release predates
// k8s.io/component-base/cli, so flags and logs are set up by hand as it did.
// The cloud auth-provider plugins are left out: tests use client certificates
// and tokens.
package main

import (
	goflag "flag"
	"math/rand"
	"os"
	"time"

	"github.com/spf13/pflag"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/logs"
	"k8s.io/kubectl/pkg/cmd"
)

func main() {
	rand.Seed(time.Now().UnixNano())

	command := cmd.NewDefaultKubectlCommand()

	pflag.CommandLine.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	pflag.CommandLine.AddGoFlagSet(goflag.CommandLine)
	logs.InitLogs()
	defer logs.FlushLogs()

	if err := command.Execute(); err != nil {
		os.Exit(1)
	}
}
