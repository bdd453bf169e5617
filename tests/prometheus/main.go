// Command prometheus runs a real Prometheus server for drover's integration
// tests: the TSDB, the scrape and discovery managers, the PromQL engine and the
// HTTP API v1 (/api/v1/query and friends) from github.com/prometheus/prometheus,
// assembled the way cmd/prometheus assembles them, on a loopback port.
//
// It is not cmd/prometheus itself (a main package cannot be imported): no web
// UI, no rules, no alerting, no remote write. Everything a query client sees
// (scraping, storage, PromQL evaluation, the JSON API and its errors) is
// Prometheus's own code.
//
// Usage: prometheus --config FILE --data DIR [--listen 127.0.0.1:0]
//
// Prints "READY http://ADDR" on stdout once the API answers and exits when its
// stdin is closed (so a killed test binary leaves nothing behind), on SIGTERM
// or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/route"
	"github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/discovery"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/scrape"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/util/logging"
	api_v1 "github.com/prometheus/prometheus/web/api/v1"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "prometheus:", err)
		os.Exit(1)
	}
}

func run() error {
	configFile := flag.String("config", "", "Prometheus configuration file (YAML, the real format)")
	dataDir := flag.String("data", "", "TSDB directory")
	listen := flag.String("listen", "127.0.0.1:0", "listen address (loopback only)")
	lookback := flag.Duration("lookback-delta", 5*time.Minute, "PromQL lookback delta")
	flag.Parse()
	if *configFile == "" || *dataDir == "" {
		return errors.New("--config and --data are required")
	}

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	reg := prometheus.NewRegistry()

	cfg, err := config.LoadFile(*configFile, false, logger)
	if err != nil {
		return fmt.Errorf("loading %s: %w", *configFile, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	opts := tsdb.DefaultOptions()
	db, err := tsdb.Open(*dataDir, logger, reg, opts, nil)
	if err != nil {
		return fmt.Errorf("opening the TSDB in %s: %w", *dataDir, err)
	}
	defer db.Close()

	sdMetrics, err := discovery.CreateAndRegisterSDMetrics(reg)
	if err != nil {
		return err
	}
	discoveryManager := discovery.NewManager(ctx, logger, reg, sdMetrics, discovery.Name("scrape"))
	if discoveryManager == nil {
		return errors.New("creating the discovery manager")
	}
	scrapeManager, err := scrape.NewManager(&scrape.Options{}, logger, logging.NewJSONFileLogger, nil, db, reg)
	if err != nil {
		return err
	}
	if err := scrapeManager.ApplyConfig(cfg); err != nil {
		return fmt.Errorf("applying the scrape config: %w", err)
	}
	scfgs, err := cfg.GetScrapeConfigs()
	if err != nil {
		return err
	}
	sd := make(map[string]discovery.Configs)
	for _, v := range scfgs {
		sd[v.JobName] = v.ServiceDiscoveryConfigs
	}
	if err := discoveryManager.ApplyConfig(sd); err != nil {
		return fmt.Errorf("applying the discovery config: %w", err)
	}
	go func() { _ = discoveryManager.Run() }()
	go func() { _ = scrapeManager.Run(discoveryManager.SyncCh()) }()
	defer scrapeManager.Stop()

	engine := promql.NewEngine(promql.EngineOpts{
		Logger:               logger,
		Reg:                  reg,
		MaxSamples:           50_000_000,
		Timeout:              2 * time.Minute,
		LookbackDelta:        *lookback,
		EnableAtModifier:     true,
		EnableNegativeOffset: true,
	})

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	addr := ln.Addr().String()

	api := api_v1.NewAPI(engine, db, nil, nil,
		func(context.Context) api_v1.ScrapePoolsRetriever { return scrapeManager },
		func(context.Context) api_v1.TargetRetriever { return scrapeManager },
		func(context.Context) api_v1.AlertmanagerRetriever { return noAlertmanagers{} },
		func() config.Config { return *cfg },
		map[string]string{},
		api_v1.GlobalURLOptions{ListenAddress: addr, Host: addr, Scheme: "http"},
		func(f http.HandlerFunc) http.HandlerFunc { return f },
		nil, *dataDir, false, false, 0, logger,
		func(context.Context) api_v1.RulesRetriever { return nil },
		0, 1, 1048576, false, nil,
		func() (api_v1.RuntimeInfo, error) { return api_v1.RuntimeInfo{}, nil },
		&api_v1.PrometheusVersion{Version: "drover-test"},
		nil, nil, reg, reg, nil,
		false, nil, false, false, false,
		*lookback, false, false, nil, nil,
		api_v1.OpenAPIOptions{ExternalURL: "http://" + addr, Version: "drover-test"},
		nil, false, 2*time.Minute,
	)
	router := route.New()
	api.Register(router.WithPrefix("/api/v1"))
	mux := http.NewServeMux()
	mux.Handle("/api/v1/", router)
	mux.HandleFunc("/-/ready", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ready\n") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	fmt.Printf("READY http://%s\n", addr)

	stdinClosed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdinClosed)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-stdinClosed:
	case <-sig:
	case err := <-serveErr:
		return err
	}
	shutdownCtx, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	_ = srv.Shutdown(shutdownCtx)
	return nil
}

// noAlertmanagers answers /api/v1/alertmanagers: this server sends no alerts.
type noAlertmanagers struct{}

func (noAlertmanagers) Alertmanagers() []*url.URL        { return nil }
func (noAlertmanagers) DroppedAlertmanagers() []*url.URL { return nil }
