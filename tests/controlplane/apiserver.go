package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"

	"github.com/spf13/pflag"

	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/cli/globalflag"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

// auditPolicy logs every request once, at Metadata level, when it completes.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

// apiserverArgs are the kube-apiserver flags for a light, loopback-only
// control plane. extra flags are appended last, so they win.
func apiserverArgs(dir string, p *pki, etcdURL string, audit bool, extra []string) ([]string, error) {
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--advertise-address=127.0.0.1",
		"--tls-cert-file=" + p.path("apiserver.crt"),
		"--tls-private-key-file=" + p.path("apiserver.key"),
		"--client-ca-file=" + p.path("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.path("sa.pub"),
		"--service-account-signing-key-file=" + p.path("sa.key"),
		"--service-cluster-ip-range=" + serviceIPRange,
		"--authorization-mode=Node,RBAC",
		// No controller-manager runs: no default ServiceAccount per namespace
		// (pod creation would fail) and nobody lifts the not-ready taint that
		// TaintNodesByCondition puts on every new Node.
		"--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
		"--allow-privileged=true",
		// Loopback addresses cannot be written to Endpoints; skip the
		// reconciler for the default/kubernetes service.
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	}
	if audit {
		policy := filepath.Join(p.dir, "audit-policy.yaml")
		if err := writeFileAtomic(policy, []byte(auditPolicy), 0o600); err != nil {
			return nil, err
		}
		args = append(args,
			"--audit-policy-file="+policy,
			"--audit-log-path="+filepath.Join(dir, "audit.log"),
			"--audit-log-format=json",
			"--audit-log-mode=blocking",
			"--audit-log-maxsize=0",
			"--audit-log-maxbackup=0",
			"--audit-log-maxage=0",
		)
	}
	return append(args, extra...), nil
}

// startAPIServer configures kube-apiserver as its own command would (see
// NewAPIServerCommand in k8s.io/kubernetes/cmd/kube-apiserver/app) but serves
// on the given, already bound listener. It runs until ctx is cancelled; the
// returned channel yields Run's result and is then closed.
func startAPIServer(ctx context.Context, ln net.Listener, args []string) (<-chan error, error) {
	s := options.NewServerRunOptions()
	featureGate := s.GenericServerRunOptions.ComponentGlobalsRegistry.FeatureGateFor(basecompatibility.DefaultKubeComponent)

	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	namedFlagSets := s.Flags()
	globalflag.AddGlobalFlags(namedFlagSets.FlagSet("global"), "kube-apiserver", logs.SkipLoggingConfigurationFlags())
	for _, f := range namedFlagSets.FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("kube-apiserver flags: %w", err)
	}

	tcp := ln.Addr().(*net.TCPAddr)
	s.SecureServing.Listener = ln
	s.SecureServing.BindPort = tcp.Port
	s.SecureServing.BindAddress = tcp.IP
	s.SecureServing.ExternalAddress = tcp.IP

	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, err
	}
	// kube-apiserver's loopback clients should not log self-issued warnings.
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	if err := logsapi.ValidateAndApply(s.Logs, featureGate); err != nil {
		return nil, err
	}
	completed, err := s.Complete(ctx)
	if err != nil {
		return nil, err
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return nil, utilerrors.NewAggregate(errs)
	}

	errCh := make(chan error, 1)
	go func() {
		defer close(errCh)
		errCh <- app.Run(ctx, completed)
	}()
	return errCh, nil
}
