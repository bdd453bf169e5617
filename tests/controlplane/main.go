// Command controlplane runs a real Kubernetes control plane for drover's
// integration tests: an embedded etcd and kube-apiserver (k8s.io/kubernetes
// v1.36.3) on 127.0.0.1, free ports, with state in one directory.
//
// Usage:
//
//	controlplane [flags] DIR [-- kube-apiserver flags...]
//
// It writes DIR/pid at once; DIR/kubeconfig (admin, group system:masters),
// DIR/restricted.kubeconfig (user drover-restricted), DIR/NAME.kubeconfig for
// each --user NAME[:GROUPS] and DIR/pki/*; and, once
// /readyz answers ok and the default namespaces exist, DIR/server (the URL)
// and a line "READY https://127.0.0.1:PORT" on stdout. SIGTERM or SIGINT
// stops kube-apiserver, then etcd. It deletes nothing.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/logs"
)

// log is this program's own logger; logs.InitLogs points the standard
// library's default logger at klog.
var log = stdlog.New(os.Stderr, "controlplane: ", stdlog.LstdFlags|stdlog.Lmicroseconds)

type config struct {
	dir          string
	audit        bool
	etcdQuotaMB  int64
	readyTimeout time.Duration
	watchPID     int
	users        []extraUser
	apiserver    []string // extra kube-apiserver flags
}

func parseArgs(argv []string) (config, error) {
	var c config
	// Everything after the first "--" goes to kube-apiserver.
	for i, a := range argv {
		if a == "--" {
			c.apiserver = argv[i+1:]
			argv = argv[:i]
			break
		}
	}
	fs := flag.NewFlagSet("controlplane", flag.ContinueOnError)
	fs.StringVar(&c.dir, "dir", "", "state directory (or give it as the positional argument)")
	fs.BoolVar(&c.audit, "audit", os.Getenv("CONTROLPLANE_AUDIT") == "1",
		"write an audit log (level Metadata) to DIR/audit.log; also enabled by CONTROLPLANE_AUDIT=1")
	fs.Int64Var(&c.etcdQuotaMB, "etcd-quota-mb", 256, "etcd backend quota in MiB")
	fs.DurationVar(&c.readyTimeout, "ready-timeout", 120*time.Second, "give up if not ready after this long")
	fs.IntVar(&c.watchPID, "watch-pid", 0, "shut down when the process with this pid is gone (0: off)")
	fs.Func("user", "extra identity NAME[:GROUP,...] (repeatable): client cert for user NAME\n"+
		"in those groups, kubeconfig DIR/NAME.kubeconfig", func(v string) error {
		u, err := parseUser(v)
		if err == nil {
			c.users = append(c.users, u)
		}
		return err
	})
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: controlplane [flags] DIR [-- kube-apiserver flags...]")
		fs.PrintDefaults()
	}
	// Allow flags before and after DIR.
	for {
		if err := fs.Parse(argv); err != nil {
			return c, err
		}
		argv = fs.Args()
		if len(argv) == 0 {
			break
		}
		if c.dir != "" {
			return c, fmt.Errorf("unexpected argument %q", argv[0])
		}
		c.dir, argv = argv[0], argv[1:]
	}
	if c.dir == "" {
		fs.Usage()
		return c, errors.New("DIR is required")
	}
	if c.watchPID == 0 {
		if v := os.Getenv("CONTROLPLANE_WATCH_PID"); v != "" {
			pid, err := strconv.Atoi(v)
			if err != nil {
				return c, fmt.Errorf("CONTROLPLANE_WATCH_PID: %w", err)
			}
			c.watchPID = pid
		}
	}
	return c, nil
}

func main() {
	c, err := parseArgs(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		log.Print(err)
		os.Exit(2)
	}
	logs.InitLogs()
	code := run(c)
	logs.FlushLogs()
	os.Exit(code)
}

func run(c config) int {
	start := time.Now()
	dir, err := filepath.Abs(c.dir)
	if err != nil {
		log.Print(err)
		return 1
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		log.Print(err)
		return 1
	}
	// DIR/server appears only once this instance is ready.
	_ = os.Remove(filepath.Join(dir, "server"))
	if err := writeFileAtomic(filepath.Join(dir, "pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		log.Print(err)
		return 1
	}

	// First SIGTERM/SIGINT: orderly shutdown. After that the default action
	// applies again, so a second signal kills the process.
	sigCtx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stopSignals()
	stopCtx, stop := context.WithCancelCause(sigCtx)
	defer stop(nil)
	go func() {
		<-sigCtx.Done()
		stopSignals()
	}()
	if c.watchPID > 0 {
		go watchPID(stopCtx, c.watchPID, stop)
	}

	p, err := newPKI(filepath.Join(dir, "pki"), c.users)
	if err != nil {
		log.Printf("pki: %v", err)
		return 1
	}

	etcd, etcdURL, err := startEtcd(filepath.Join(dir, "etcd"), c.etcdQuotaMB<<20)
	if err != nil {
		log.Print(err)
		return 1
	}
	log.Printf("etcd ready at %s after %s", etcdURL, time.Since(start).Round(time.Millisecond))
	defer stopEtcd(etcd)

	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		log.Print(err)
		return 1
	}
	server := "https://" + ln.Addr().String()
	if err := p.writeKubeconfig(filepath.Join(dir, "kubeconfig"), server, adminUser, p.admin); err != nil {
		log.Print(err)
		return 1
	}
	if err := p.writeKubeconfig(filepath.Join(dir, "restricted.kubeconfig"), server, "restricted", p.restricted); err != nil {
		log.Print(err)
		return 1
	}
	for name, kp := range p.users {
		if err := p.writeKubeconfig(filepath.Join(dir, name+".kubeconfig"), server, name, kp); err != nil {
			log.Print(err)
			return 1
		}
	}

	args, err := apiserverArgs(dir, p, etcdURL, c.audit, c.apiserver)
	if err != nil {
		log.Print(err)
		return 1
	}
	apiCtx, apiCancel := context.WithCancel(context.Background())
	defer apiCancel()
	apiDone, err := startAPIServer(apiCtx, ln, args)
	if err != nil {
		log.Printf("kube-apiserver: %v", err)
		ln.Close()
		return 1
	}

	code := 0
	tlsCfg, err := p.adminTLS()
	if err != nil {
		log.Print(err)
		code = 1
	} else if err := waitReady(stopCtx, server, tlsCfg, c.readyTimeout, apiDone); err != nil {
		log.Printf("not ready: %v", err)
		code = 1
	} else {
		if err := writeFileAtomic(filepath.Join(dir, "server"), []byte(server+"\n"), 0o644); err != nil {
			log.Print(err)
			code = 1
		} else {
			log.Printf("ready after %s", time.Since(start).Round(time.Millisecond))
			fmt.Printf("READY %s\n", server)
			select {
			case <-stopCtx.Done():
				log.Printf("stopping: %v", context.Cause(stopCtx))
			case err := <-apiDone:
				log.Printf("kube-apiserver exited: %v", err)
				return 1
			case err := <-etcd.Err():
				log.Printf("etcd failed: %v", err)
				code = 1
			}
		}
	}

	// Orderly shutdown: kube-apiserver first, then etcd (deferred).
	apiCancel()
	select {
	case err, ok := <-apiDone:
		if ok && err != nil {
			log.Printf("kube-apiserver stopped with error: %v", err)
		} else {
			log.Print("kube-apiserver stopped")
		}
	case <-time.After(60 * time.Second):
		log.Print("kube-apiserver did not stop within 60s")
		code = 1
	}
	return code
}

func stopEtcd(e *embed.Etcd) {
	etcdStopping.Store(true)
	done := make(chan struct{})
	go func() { e.Close(); close(done) }()
	select {
	case <-done:
		log.Print("etcd stopped")
	case <-time.After(30 * time.Second):
		log.Print("etcd did not stop within 30s")
	}
}

// watchPID cancels stop once process pid no longer exists.
func watchPID(ctx context.Context, pid int, stop context.CancelCauseFunc) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
				stop(fmt.Errorf("watched process %d is gone", pid))
				return
			}
		}
	}
}

// waitReady polls /readyz until it answers ok and the namespaces the
// bootstrap controller creates exist.
func waitReady(ctx context.Context, server string, tlsCfg *tls.Config, timeout time.Duration, apiDone <-chan error) error {
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: tlsCfg},
	}
	defer client.CloseIdleConnections()
	deadline := time.After(timeout)
	paths := []string{"/readyz", "/api/v1/namespaces/default", "/api/v1/namespaces/kube-system"}
	last := ""
	for len(paths) > 0 {
		ok, status := get(ctx, client, server+paths[0])
		if ok {
			paths = paths[1:]
			continue
		}
		last = paths[0] + ": " + status
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case err := <-apiDone:
			return fmt.Errorf("kube-apiserver exited: %v", err)
		case <-deadline:
			return fmt.Errorf("timed out after %s (last: %s)", timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

func get(ctx context.Context, client *http.Client, url string) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode == http.StatusOK {
		return true, ""
	}
	return false, fmt.Sprintf("%d %s", resp.StatusCode, body)
}
