// kubectl, as k8s.io/kubernetes/cmd/kubectl builds it, from the k8s.io/kubectl
// module at the control plane's version: the install test runs the commands
// of docs/install.md with it against the test API server.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
