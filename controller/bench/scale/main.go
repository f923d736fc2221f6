package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2/textlogger"
)

// defaultOptions are the recorded run's options but the Pod count, which the flag sets.
func defaultOptions() Options {
	return Options{
		Pods: 1000, Pools: 10, Nodes: 10,
		Lease: 2 * time.Minute, Poll: 15 * time.Second,
		Rest: 2 * time.Minute, Clients: 100, Load: time.Minute,
		ReadyTimeout: 15 * time.Minute, Workers: 8, HomeStarts: 32,
		CRD: "../deploy/controller/fiberd.io_fiberpools.yaml",
	}
}

// parseFlags reads args into Options.
func parseFlags(args []string, stderr io.Writer) (Options, error) {
	o := defaultOptions()
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.Pods, "pods", o.Pods, "grant Pods in all")
	fs.IntVar(&o.Pools, "pools", o.Pools, "FiberPools the Pods are spread over (-pods must be a multiple)")
	fs.IntVar(&o.Nodes, "nodes", o.Nodes, "simulated Nodes the Pods are bound to")
	fs.DurationVar(&o.Lease, "lease", o.Lease, "the pools' spec.lease; the homes renew at half of it, so the rest window should be at least as long")
	fs.DurationVar(&o.Poll, "poll", o.Poll, "the homes' Pod poll (fiberd's default is 15s)")
	fs.DurationVar(&o.Rest, "rest", o.Rest, "length of the window measured at rest")
	fs.IntVar(&o.Clients, "clients", o.Clients, "pool clients watching EndpointSlices in the Clone-load window")
	fs.DurationVar(&o.Load, "load", o.Load, "length of the Clone-load window")
	fs.DurationVar(&o.ReadyTimeout, "ready-timeout", o.ReadyTimeout, "how long every Pod may take to be Ready")
	fs.IntVar(&o.Workers, "workers", o.Workers, "goroutines of the simulated kubelets")
	fs.IntVar(&o.HomeStarts, "home-starts", o.HomeStarts, "homes starting (token, discovery, first grant fetch) at once")
	fs.StringVar(&o.CRD, "crd", o.CRD, "path of deploy/controller/fiberd.io_fiberpools.yaml")
	fs.StringVar(&o.Dir, "dir", "", "directory kept for the logs (controller.log, homes.log) and the homes' files; empty means a temporary one, removed")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q: scale takes flags only", fs.Arg(0))
	}
	return o, o.Validate()
}

func main() {
	runChildIfAsked()
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "scale: %v\n", err)
		os.Exit(2)
	}
	o.Log = textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(os.Stderr)))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	res, err := Run(ctx, o)
	if err != nil {
		o.Log.Error(err, "scale benchmark failed")
		os.Exit(1)
	}
	writeReport(os.Stdout, res)
}

// newFileLogger is a klog text logger writing to w.
func newFileLogger(w io.Writer) logr.Logger {
	return textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(w)))
}

// writeReport prints res as Markdown: the run, the ramp, each window's rates by verb and
// resource and by sender, and the memory.
func writeReport(w io.Writer, res *Result) {
	o := res.Options
	fmt.Fprintf(w, "## fiberd scale: %d grant Pods in %d FiberPools on %d simulated Nodes\n\n", o.Pods, o.Pools, o.Nodes)
	fmt.Fprintf(w, "lease %v (renewal at %v), Pod poll %v, %d CPUs, %s\n\n", o.Lease, o.Lease/2, o.Poll, res.CPUs, runtime.Version())
	fmt.Fprintf(w, "| ramp | value |\n|---|---|\n")
	fmt.Fprintf(w, "| pools created to every Pod Ready | %.1f s |\n", res.ReadyAfter.Seconds())
	fmt.Fprintf(w, "| pools created to every pool's status.readyReplicas full | %.1f s |\n", res.StatusAfter.Seconds())
	fmt.Fprintf(w, "| reconciles during the ramp | %.0f (p50 %s, p99 %s) |\n", res.RampReconciles, ms(res.RampReconcileP50), ms(res.RampReconcileP99))
	fmt.Fprintf(w, "| homes started / readiness published / scope lost | %d / %d / %d |\n", res.HomesStarted, res.ReadyPublished, res.ScopeLost)
	fmt.Fprintf(w, "| controller RSS / Go heap at rest | %.1f MiB / %.1f MiB |\n", res.ControllerRSS/(1<<20), res.ControllerHeap/(1<<20))
	fmt.Fprintf(w, "| benchmark process (homes, kubelets) RSS / Go heap | %.1f MiB / %.1f MiB |\n\n", res.BenchRSS/(1<<20), res.BenchHeap/(1<<20))
	fmt.Fprintf(w, "### ramp: API requests per Pod brought Ready (%.1f in all)\n\n| verb resource | requests per Pod |\n|---|---|\n", totalRate(res.RampPerPod))
	for _, r := range res.RampPerPod {
		fmt.Fprintf(w, "| %s | %.3f |\n", r.Key, r.PerSec)
	}
	fmt.Fprintln(w)
	for _, win := range res.Windows {
		fmt.Fprintf(w, "### %s (%.0f s; slowest scrape %.1f s)\n\n", win.Name, win.Seconds, win.Scrape.Seconds())
		fmt.Fprintf(w, "API requests %.2f/s: homes %.2f/s, controller %.2f/s (issuer's TokenReviews and Pod reads included), others %.2f/s; open WATCHes %.0f; grants issued %.2f/s; reconciles %.2f/s (p50 %s, p99 %s)\n\n",
			win.Total, win.Homes, win.Controller, math.Max(0, win.Total-win.Homes-win.Controller), win.Watches, win.Renewals, win.Reconciles, ms(win.ReconcileP50), ms(win.ReconcileP99))
		fmt.Fprintf(w, "| verb resource | requests/s |\n|---|---|\n")
		for _, r := range win.Rates {
			fmt.Fprintf(w, "| %s | %.3f |\n", r.Key, r.PerSec)
		}
		fmt.Fprintln(w)
	}
	if res.ClientsEndpoints > 0 || o.Clients > 0 {
		fmt.Fprintf(w, "pool clients: %d, endpoints seen in all %d\n", o.Clients, res.ClientsEndpoints)
	}
}

func ms(sec float64) string {
	if math.IsNaN(sec) {
		return "n/a"
	}
	return fmt.Sprintf("%.1f ms", sec*1000)
}
