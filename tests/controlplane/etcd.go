package main

import (
	"fmt"
	"net/url"
	"os"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// etcdStopping is set just before etcd is closed: from then on the errors
// its listeners report on close ("mux: server closed", "use of closed
// network connection") are expected, and dropped from the log.
var etcdStopping atomic.Bool

// etcdLogger logs etcd's errors (JSON) to stderr, less the noise of an
// orderly close.
func etcdLogger() (*zap.Logger, error) {
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
	zc.OutputPaths = []string{"stderr"}
	zc.ErrorOutputPaths = []string{"stderr"}
	zc.Sampling = nil
	return zc.Build(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return quietOnClose{c} }))
}

type quietOnClose struct{ zapcore.Core }

func (q quietOnClose) With(f []zapcore.Field) zapcore.Core { return quietOnClose{q.Core.With(f)} }

func (q quietOnClose) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if etcdStopping.Load() && e.Message == "setting up serving from embedded etcd failed." {
		return ce
	}
	return q.Core.Check(e, ce)
}

// startEtcd starts a single-member etcd with its data in dir, listening on
// free loopback ports (port 0: the kernel picks, so parallel instances never
// race for a port). It returns the server and its client URL.
func startEtcd(dir string, quotaBytes int64) (*embed.Etcd, string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", err
	}
	var e *embed.Etcd
	cfg := embed.NewConfig()
	cfg.Name = "controlplane"
	cfg.Dir = dir
	// A throw-away test store: durability across power loss is not needed.
	cfg.UnsafeNoFsync = true
	cfg.QuotaBackendBytes = quotaBytes
	// Keep the in-memory raft log short.
	cfg.SnapshotCount = 5000
	cfg.SnapshotCatchUpEntries = 1000
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{"stderr"}
	lg, err := etcdLogger()
	if err != nil {
		return nil, "", err
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	cfg.Metrics = "basic"
	// kube-apiserver speaks gRPC; the JSON gateway would also dial the
	// listen address, which is port 0 here.
	cfg.EnableGRPCGateway = false

	client := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	peer := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)

	e, err = embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		etcdStopping.Store(true)
		e.Close()
		return nil, "", fmt.Errorf("etcd failed: %w", err)
	case <-time.After(60 * time.Second):
		etcdStopping.Store(true)
		e.Server.Stop()
		e.Close()
		return nil, "", fmt.Errorf("etcd not ready after 60s")
	}
	if len(e.Clients) == 0 {
		etcdStopping.Store(true)
		e.Close()
		return nil, "", fmt.Errorf("etcd has no client listener")
	}
	return e, "http://" + e.Clients[0].Addr().String(), nil
}
