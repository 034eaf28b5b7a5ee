// Command peer runs one Go informer against an API server and is driven by benches/compare
// over a line protocol on stdin and stdout (docs/bench/peers.md).
//
//	peer -server http://127.0.0.1:PORT -system client-go|controller-runtime [-content-type json|protobuf]
//	peer -kubeconfig FILE -system … -resource configmaps   (a real kube-apiserver; benches/envtest_restart)
//
// client-go is a SharedIndexInformer for Pods from a SharedInformerFactory (the namespace
// index it always has, plus a "labels" index of key=value pairs, the analogue of the label
// index durable-informer is given); controller-runtime is its cache.Cache with an informer
// for Pods, read through the cache's client.Reader (which deep-copies what it returns, as
// every controller-runtime user gets by default).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// configMaps: the informers watch ConfigMaps instead of Pods (-resource configmaps); the
// reads command is then refused (its figures are defined over Pods).
var configMaps bool

// syncTimeout bounds every wait: a benchmark must not hang.
const syncTimeout = 30 * time.Minute

// readBudget and readMinIters: the rules of the harness's time_per_op (benches/compare/scenarios.rs).
const (
	readBudget   = 3 * time.Second
	readMinIters = 3
)

// out serialises everything written to stdout: replies and event reports.
type out struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (o *out) reply(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprintf(o.w, format+"\n", args...)
	_ = o.w.Flush()
}

// event is one handler call reported to the harness.
type event struct {
	kind byte // 'a' add, 'u' update, 'd' delete
	rv   string
	mono int64 // CLOCK_MONOTONIC, ns
}

// clock converts Go's monotonic readings to CLOCK_MONOTONIC nanoseconds, the clock behind
// Rust's Instant on Linux, so the harness can subtract its write times from them.
type clock struct {
	mono0 int64
	t0    time.Time
}

func newClock() clock {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return clock{mono0: ts.Nano(), t0: time.Now()}
}

func (c clock) now() int64 { return c.mono0 + time.Since(c.t0).Nanoseconds() }

// informer is what both systems offer the harness.
type informer interface {
	// waitSynced blocks until the store and the counting handler have the initial list.
	waitSynced(ctx context.Context) error
	len() int
	stop()
	reads(ctx context.Context, n int, ns []string, gets, lists int) (string, error)
}

// counter is the handler both systems register: it counts every call and, while reporting,
// sends each one's resourceVersion and time to the writer.
type counter struct {
	events atomic.Uint64
	report atomic.Bool
	clk    clock
	ch     chan event
}

func (c *counter) record(kind byte, obj any) {
	c.events.Add(1)
	if !c.report.Load() {
		return
	}
	m, ok := obj.(metav1.Object)
	if !ok {
		if d, isTomb := obj.(toolscache.DeletedFinalStateUnknown); isTomb {
			m, ok = d.Obj.(metav1.Object)
		}
		if !ok {
			return
		}
	}
	c.ch <- event{kind: kind, rv: m.GetResourceVersion(), mono: c.clk.now()}
}

func (c *counter) handler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    func(obj any, _ bool) { c.record('a', obj) },
		UpdateFunc: func(_, obj any) { c.record('u', obj) },
		DeleteFunc: func(obj any) { c.record('d', obj) },
	}
}

// writeEvents drains the channel into stdout, flushing whenever it is empty (so a lone event
// goes out at once and a burst in few writes).
func writeEvents(o *out, ch <-chan event) {
	buf := make([]byte, 0, 64)
	for ev := range ch {
		o.mu.Lock()
		for {
			buf = append(buf[:0], 'e', ' ', ev.kind, ' ')
			buf = append(buf, ev.rv...)
			buf = append(buf, ' ')
			buf = strconv.AppendInt(buf, ev.mono, 10)
			buf = append(buf, '\n')
			_, _ = o.w.Write(buf)
			select {
			case ev = <-ch:
				continue
			default:
			}
			break
		}
		_ = o.w.Flush()
		o.mu.Unlock()
	}
}

// ---------------------------------------------------------------------------------------------
// client-go

type clientGo struct {
	factory  informers.SharedInformerFactory
	informer toolscache.SharedIndexInformer
	lister   listersv1.PodLister
	reg      toolscache.ResourceEventHandlerRegistration
	stopCh   chan struct{}
}

func labelIndex(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	keys := make([]string, 0, len(pod.Labels))
	for k, v := range pod.Labels {
		keys = append(keys, k+"="+v)
	}
	return keys, nil
}

func startClientGo(cfg *rest.Config, c *counter) (informer, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	factory := informers.NewSharedInformerFactory(cs, 0)
	if configMaps {
		inf := factory.Core().V1().ConfigMaps().Informer()
		reg, err := inf.AddEventHandler(c.handler())
		if err != nil {
			return nil, err
		}
		g := &clientGo{factory: factory, informer: inf, reg: reg, stopCh: make(chan struct{})}
		factory.Start(g.stopCh)
		return g, nil
	}
	pods := factory.Core().V1().Pods()
	inf := pods.Informer()
	if err := inf.AddIndexers(toolscache.Indexers{"labels": labelIndex}); err != nil {
		return nil, err
	}
	reg, err := inf.AddEventHandler(c.handler())
	if err != nil {
		return nil, err
	}
	g := &clientGo{factory: factory, informer: inf, lister: pods.Lister(), reg: reg, stopCh: make(chan struct{})}
	factory.Start(g.stopCh)
	return g, nil
}

func (g *clientGo) waitSynced(ctx context.Context) error {
	if !toolscache.WaitFor(ctx, "pods", g.informer.HasSyncedChecker(), g.reg.HasSyncedChecker()) {
		return errors.New("client-go informer did not sync")
	}
	return nil
}

func (g *clientGo) len() int { return len(g.informer.GetStore().ListKeys()) }

func (g *clientGo) stop() {
	close(g.stopCh)
	g.factory.Shutdown()
}

func (g *clientGo) reads(_ context.Context, n int, ns []string, gets, lists int) (string, error) {
	if g.lister == nil {
		return "", errors.New("reads are defined over Pods")
	}
	var err error
	getUs, _ := timePerOp(gets, func(i int) int {
		namespace, name := podRef(ns, (i*7919)%n)
		p, e := g.lister.Pods(namespace).Get(name)
		if e != nil {
			err = e
			return 0
		}
		if p != nil {
			return 1
		}
		return 0
	})
	if err != nil {
		return "", err
	}
	listUs, listLen := timePerOp(lists, func(i int) int {
		l, e := g.lister.Pods(ns[i%len(ns)]).List(labels.Everything())
		if e != nil {
			err = e
		}
		return len(l)
	})
	labelUs, labelLen := timePerOp(lists, func(int) int {
		l, e := g.informer.GetIndexer().ByIndex("labels", "app=web")
		if e != nil {
			err = e
		}
		return len(l)
	})
	return fmt.Sprintf("%f %f %d %f %d", getUs, listUs, listLen, labelUs, labelLen), err
}

// ---------------------------------------------------------------------------------------------
// controller-runtime

type controllerRuntime struct {
	cache  crcache.Cache
	inf    crcache.Informer
	reg    toolscache.ResourceEventHandlerRegistration
	cancel context.CancelFunc
	done   chan struct{}
}

func startControllerRuntime(cfg *rest.Config, c *counter) (informer, error) {
	ca, err := crcache.New(cfg, crcache.Options{})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var obj client.Object = &corev1.Pod{}
	if configMaps {
		obj = &corev1.ConfigMap{}
	}
	inf, err := ca.GetInformer(ctx, obj, crcache.BlockUntilSynced(false))
	if err != nil {
		cancel()
		return nil, err
	}
	reg, err := inf.AddEventHandler(c.handler())
	if err != nil {
		cancel()
		return nil, err
	}
	r := &controllerRuntime{cache: ca, inf: inf, reg: reg, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		if err := ca.Start(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "controller-runtime cache: %v\n", err)
		}
	}()
	return r, nil
}

// waitSynced waits on the informer's and the handler's done channels. (The cache's own
// WaitForCacheSync, which a manager calls, polls every 100 ms: it would round every figure up.)
func (r *controllerRuntime) waitSynced(ctx context.Context) error {
	if !toolscache.WaitFor(ctx, "pods", r.inf.HasSyncedChecker(), r.reg.HasSyncedChecker()) {
		return errors.New("controller-runtime cache did not sync")
	}
	return nil
}

// len counts the keys in the informer's store: a List through the cache would deep-copy
// every object and raise the peak RSS the harness reads next.
func (r *controllerRuntime) len() int {
	if s, ok := r.inf.(interface{ GetStore() toolscache.Store }); ok {
		return len(s.GetStore().ListKeys())
	}
	return -1
}

func (r *controllerRuntime) stop() {
	r.cancel()
	<-r.done
}

func (r *controllerRuntime) reads(ctx context.Context, n int, ns []string, gets, lists int) (string, error) {
	var err error
	getUs, _ := timePerOp(gets, func(i int) int {
		namespace, name := podRef(ns, (i*7919)%n)
		var p corev1.Pod
		if e := r.cache.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &p); e != nil {
			err = e
			return 0
		}
		return 1
	})
	if err != nil {
		return "", err
	}
	listUs, listLen := timePerOp(lists, func(i int) int {
		var l corev1.PodList
		if e := r.cache.List(ctx, &l, client.InNamespace(ns[i%len(ns)])); e != nil {
			err = e
		}
		return len(l.Items)
	})
	labelUs, labelLen := timePerOp(lists, func(int) int {
		var l corev1.PodList
		if e := r.cache.List(ctx, &l, client.MatchingLabels{"app": "web"}); e != nil {
			err = e
		}
		return len(l.Items)
	})
	return fmt.Sprintf("%f %f %d %f %d", getUs, listUs, listLen, labelUs, labelLen), err
}

// ---------------------------------------------------------------------------------------------

func podRef(ns []string, i int) (string, string) {
	return ns[i%len(ns)], "pod-" + strconv.Itoa(i)
}

// timePerOp: mean µs per call of f over up to iters calls (at least readMinIters, at most
// readBudget), and the last result.
func timePerOp(iters int, f func(int) int) (float64, int) {
	start := time.Now()
	last, done := 0, 0
	for i := 0; i < iters; i++ {
		last = f(i)
		done++
		if done >= readMinIters && time.Since(start) > readBudget {
			break
		}
	}
	return float64(time.Since(start).Nanoseconds()) / 1e3 / float64(max(done, 1)), last
}

func moduleVersion(path string) string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, d := range info.Deps {
		if d.Path == path {
			return d.Version
		}
	}
	return "unknown"
}

func main() {
	server := flag.String("server", "", "API server URL (http://127.0.0.1:PORT)")
	system := flag.String("system", "client-go", "client-go or controller-runtime")
	contentType := flag.String("content-type", "json", "json or protobuf (what the client asks for)")
	kubeconfig := flag.String("kubeconfig", "", "a kubeconfig file (instead of -server)")
	resource := flag.String("resource", "pods", "pods or configmaps")
	flag.Parse()
	switch *resource {
	case "pods":
	case "configmaps":
		configMaps = true
	default:
		fmt.Fprintf(os.Stderr, "peer: unknown -resource %q\n", *resource)
		os.Exit(2)
	}
	cfg := &rest.Config{Host: *server}
	switch {
	case *kubeconfig != "":
		c, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
		if err != nil {
			fmt.Fprintf(os.Stderr, "peer: -kubeconfig: %v\n", err)
			os.Exit(2)
		}
		cfg = c
	case *server == "":
		fmt.Fprintln(os.Stderr, "peer: -server or -kubeconfig is required")
		os.Exit(2)
	}
	// No client-side rate limit: the server is local and the harness measures the informer,
	// not the token bucket (controller-runtime's GetConfig turns it off the same way).
	cfg.QPS = -1
	cfg.UserAgent = "durable-informer-bench-peer/" + *system
	switch *contentType {
	case "json":
		cfg.ContentType = "application/json"
	case "protobuf":
		// What kube-controller-manager asks for: protobuf first, JSON for kinds without it.
		cfg.ContentType = "application/vnd.kubernetes.protobuf"
		cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	default:
		fmt.Fprintf(os.Stderr, "peer: unknown -content-type %q\n", *contentType)
		os.Exit(2)
	}
	var start func(*rest.Config, *counter) (informer, error)
	var version string
	switch *system {
	case "client-go":
		start, version = startClientGo, moduleVersion("k8s.io/client-go")
	case "controller-runtime":
		start, version = startControllerRuntime, moduleVersion("sigs.k8s.io/controller-runtime")
	default:
		fmt.Fprintf(os.Stderr, "peer: unknown -system %q\n", *system)
		os.Exit(2)
	}

	// controller-runtime logs through klog, as client-go does (else it warns at the first line).
	ctrllog.SetLogger(klog.NewKlogr())
	o := &out{w: bufio.NewWriterSize(os.Stdout, 1<<16)}
	c := &counter{clk: newClock(), ch: make(chan event, 1<<16)}
	go writeEvents(o, c.ch)
	o.reply("hello %s %s %s %s", *system, version, runtime.Version(), *contentType)

	var inf informer
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch cmd := f[0]; {
		case cmd == "start":
			if inf != nil {
				o.reply("err already started")
				continue
			}
			c.events.Store(0)
			var err error
			if inf, err = start(cfg, c); err != nil {
				o.reply("err start: %s", oneLine(err))
				continue
			}
			o.reply("ok started")
		case cmd == "synced":
			if inf == nil {
				o.reply("err not started")
				continue
			}
			// WaitFor logs its start and end through the context's logger: keep stderr for errors.
			ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), logr.Discard()), syncTimeout)
			err := inf.waitSynced(ctx)
			cancel()
			if err != nil {
				o.reply("err %s", oneLine(err))
				continue
			}
			o.reply("ok synced %d %d", inf.len(), c.events.Load())
		case cmd == "count":
			if inf == nil {
				o.reply("err not started")
				continue
			}
			o.reply("ok count %d %d", inf.len(), c.events.Load())
		case cmd == "report" && len(f) == 2:
			c.report.Store(f[1] == "on")
			o.reply("ok report %s", f[1])
		case cmd == "stop":
			if inf != nil {
				inf.stop()
				inf = nil
			}
			o.reply("ok stopped")
		case cmd == "gc":
			runtime.GC()
			o.reply("ok gc")
		case cmd == "reads" && len(f) >= 5:
			// reads N GETS LISTS NS...
			n, e1 := strconv.Atoi(f[1])
			gets, e2 := strconv.Atoi(f[2])
			lists, e3 := strconv.Atoi(f[3])
			if err := errors.Join(e1, e2, e3); err != nil || inf == nil || n < 1 {
				o.reply("err reads: bad arguments or not started: %v", err)
				continue
			}
			res, err := inf.reads(context.Background(), n, f[4:], gets, lists)
			if err != nil {
				o.reply("err reads: %s", oneLine(err))
				continue
			}
			o.reply("ok reads %s", res)
		case cmd == "quit":
			if inf != nil {
				inf.stop()
			}
			o.reply("ok bye")
			return
		default:
			o.reply("err unknown command %q", in.Text())
		}
	}
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", " ") }
