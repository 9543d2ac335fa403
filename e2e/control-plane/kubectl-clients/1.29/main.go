// Command kubectl is kubectl v1.29 as Kubernetes v1.29's cmd/kubectl/kubectl.go
// builds it, for testing that older clients (Spinnaker's Clouddriver ships
// kubectl 1.22 to 1.29) work through Scale Agent. The auth-provider plugins
// are left out: tests use client certificates and tokens.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		// Pretty-print the error and exit with an error.
		util.CheckErr(err)
	}
}
