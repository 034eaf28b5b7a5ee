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

// readBudget and readMinIters: the rules of the harness's time_per_op; warmPasses: its
// WARM_PASSES (benches/compare/scenarios.rs).
const (
	readBudget   = 3 * time.Second
	readMinIters = 3
	warmPasses   = 2
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
	// reader gives the Pod reads the harness times; an error when the informer has no Pods.
	reader() (reader, error)
}

// reader: the reads the harness times, through each system's own read API.
type reader interface {
	get(ctx context.Context, namespace, name string) (bool, error)
	// list one namespace, with a label selector.
	list(ctx context.Context, namespace string, sel labels.Selector) (int, error)
	// byLabel: every Pod labelled app=web, through the label index where the system has one.
	byLabel(ctx context.Context) (int, error)
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

func (g *clientGo) reader() (reader, error) {
	if g.lister == nil {
		return nil, errors.New("reads are defined over Pods")
	}
	return g, nil
}

func (g *clientGo) get(_ context.Context, namespace, name string) (bool, error) {
	p, err := g.lister.Pods(namespace).Get(name)
	return p != nil, err
}

func (g *clientGo) list(_ context.Context, namespace string, sel labels.Selector) (int, error) {
	l, err := g.lister.Pods(namespace).List(sel)
	return len(l), err
}

func (g *clientGo) byLabel(context.Context) (int, error) {
	l, err := g.informer.GetIndexer().ByIndex("labels", "app=web")
	return len(l), err
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

func (r *controllerRuntime) reader() (reader, error) {
	if configMaps {
		return nil, errors.New("reads are defined over Pods")
	}
	return r, nil
}

func (r *controllerRuntime) get(ctx context.Context, namespace, name string) (bool, error) {
	var p corev1.Pod
	if err := r.cache.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &p); err != nil {
		return false, err
	}
	return true, nil
}

func (r *controllerRuntime) list(ctx context.Context, namespace string, sel labels.Selector) (int, error) {
	var l corev1.PodList
	err := r.cache.List(ctx, &l, client.InNamespace(namespace), client.MatchingLabelsSelector{Selector: sel})
	return len(l.Items), err
}

func (r *controllerRuntime) byLabel(ctx context.Context) (int, error) {
	var l corev1.PodList
	err := r.cache.List(ctx, &l, client.MatchingLabels{"app": "web"})
	return len(l.Items), err
}

// ---------------------------------------------------------------------------------------------

// reads times the harness's reads (docs/bench/peers.md): over every object (gets by the
// stride 7919, each namespace in turn, the label index), then over a hot set of the first
// `hot` objects of that stride and the first namespace, each read warmPasses times first.
// The answer: get, list, its length, select, its length, for each of the two, in that order.
func reads(ctx context.Context, r reader, n int, ns []string, gets, lists, hot int) (string, error) {
	var err error
	keep := func(e error) {
		if e != nil && err == nil {
			err = e
		}
	}
	one := func(k int, f func(int) (int, error)) func(int) int {
		return func(i int) int {
			v, e := f(i % k)
			keep(e)
			return v
		}
	}
	get := func(i int) (int, error) {
		namespace, name := podRef(ns, (i*7919)%n)
		found, e := r.get(ctx, namespace, name)
		if found {
			return 1, e
		}
		return 0, e
	}
	everything := labels.Everything()
	web := labels.SelectorFromSet(labels.Set{"app": "web"})
	listNs := func(i int) (int, error) { return r.list(ctx, ns[i%len(ns)], everything) }
	getUs, _ := timePerOp(gets, one(n, get))
	listUs, listLen := timePerOp(lists, one(len(ns), listNs))
	labelUs, labelLen := timePerOp(lists, one(1, func(int) (int, error) { return r.byLabel(ctx) }))
	// The hot set: read warmPasses times, then timed.
	hot = min(max(hot, 1), n)
	hotList := func(int) (int, error) { return r.list(ctx, ns[0], everything) }
	hotSelect := func(int) (int, error) { return r.list(ctx, ns[0], web) }
	for range warmPasses {
		for i := 0; i < hot; i++ {
			_, e := get(i)
			keep(e)
		}
		for _, f := range []func(int) (int, error){hotList, hotSelect} {
			_, e := f(0)
			keep(e)
		}
	}
	hotGetUs, _ := timePerOp(gets, one(hot, get))
	hotListUs, hotListLen := timePerOp(lists, one(1, hotList))
	hotSelectUs, hotSelectLen := timePerOp(lists, one(1, hotSelect))
	return fmt.Sprintf("%f %f %d %f %d %f %f %d %f %d", getUs, listUs, listLen, labelUs, labelLen,
		hotGetUs, hotListUs, hotListLen, hotSelectUs, hotSelectLen), err
}

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
		case cmd == "reads" && len(f) >= 6:
			// reads N GETS LISTS HOT NS...
			var errs []error
			num := func(v string) int {
				x, err := strconv.Atoi(v)
				errs = append(errs, err)
				return x
			}
			n, gets, lists, hot := num(f[1]), num(f[2]), num(f[3]), num(f[4])
			if err := errors.Join(errs...); err != nil || inf == nil || n < 1 {
				o.reply("err reads: bad arguments or not started: %v", err)
				continue
			}
			r, err := inf.reader()
			if err != nil {
				o.reply("err reads: %s", oneLine(err))
				continue
			}
			res, err := reads(context.Background(), r, n, f[5:], gets, lists, hot)
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
