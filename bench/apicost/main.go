package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/matbus/matbus/bench/internal/load"
	"github.com/matbus/matbus/kubelocal"
)

// variant is one way of deleting the Services.
type variant struct {
	Name     string
	Clients  int     // clients the deletes are spread over
	InFlight int     // calls in flight in total
	Protobuf bool    // clients speak protobuf (as matbus workers do)
	Rate     float64 // deletes per second in total; 0 is no limit
	Watchers int     // protobuf Service informers open during the deletes
}

// parseVariants parses "floor,clients3,paced:330,watchers:4" (see doc.go).
// inFlight is the floor's calls in flight.
func parseVariants(s string, inFlight int) ([]variant, error) {
	var out []variant
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		name, arg, hasArg := strings.Cut(f, ":")
		num := func() (float64, error) {
			v, err := strconv.ParseFloat(arg, 64)
			if !hasArg || err != nil || v <= 0 {
				return 0, fmt.Errorf("--variants: %q needs a positive number after %q", f, name+":")
			}
			return v, nil
		}
		switch name {
		case "floor":
			out = append(out, variant{Name: f, Clients: 1, InFlight: inFlight})
		case "clients3":
			out = append(out, variant{Name: f, Clients: 3, InFlight: 96, Protobuf: true})
		case "paced":
			r, err := num()
			if err != nil {
				return nil, err
			}
			out = append(out, variant{Name: f, Clients: 3, InFlight: 96, Protobuf: true, Rate: r})
		case "watchers":
			w, err := num()
			if err != nil {
				return nil, err
			}
			out = append(out, variant{Name: f, Clients: 1, InFlight: inFlight, Watchers: int(w)})
		default:
			return nil, fmt.Errorf("--variants: unknown variant %q (floor, clients3, paced:R, watchers:W)", f)
		}
		if hasArg && name != "paced" && name != "watchers" {
			return nil, fmt.Errorf("--variants: %q takes no argument", name)
		}
	}
	return out, nil
}

type config struct {
	services, repeat, inFlight int
	variants                   []variant
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("apicost", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{}
	var variants string
	fs.IntVar(&c.services, "services", 2000, "Services created and deleted per variant (at most 60,000: they take ClusterIPs from 10.100.0.0/16)")
	fs.IntVar(&c.repeat, "repeat", 2, "runs of the whole variant list, alternating")
	fs.IntVar(&c.inFlight, "in-flight", 50, "calls in flight of the floor and watchers variants, and of the creates")
	fs.StringVar(&variants, "variants", "floor,clients3,paced:330,watchers:4", "comma-separated variants: floor, clients3, paced:R, watchers:W")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.services < 1 || c.services > 60000:
		return nil, errors.New("--services must be 1–60000")
	case c.repeat < 1:
		return nil, errors.New("--repeat must be >= 1")
	case c.inFlight < 1:
		return nil, errors.New("--in-flight must be >= 1")
	}
	var err error
	c.variants, err = parseVariants(variants, c.inFlight)
	return c, err
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/apicost:", err)
		os.Exit(2)
	}
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench/apicost:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg *config, out io.Writer) error {
	bin, err := kubelocal.FindBinaries()
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	cl, err := kubelocal.Start(sctx, kubelocal.Config{BinDir: bin})
	cancel()
	if err != nil {
		return err
	}
	defer cl.Stop()
	raw, err := client(cl.RESTConfig(), -1, false)
	if err != nil {
		return err
	}
	ns := "apicost"
	if _, err := raw.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	svcs := services(ns, cfg.services)
	idle, err := apiCores(ctx, 5*time.Second)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "kube-apiserver idle: %.3f cores\n\n| run | variant | seconds | deletes/s | API server CPU per delete (ms) | API server cores |\n|---:|---|---:|---:|---:|---:|\n", idle)
	for rep := 1; rep <= cfg.repeat; rep++ {
		for _, v := range cfg.variants {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if err := each(ctx, cfg.inFlight, svcs, func(ctx context.Context, s *corev1.Service) error {
				_, err := raw.CoreV1().Services(ns).Create(ctx, s, metav1.CreateOptions{})
				return err
			}); err != nil {
				return fmt.Errorf("create: %w", err)
			}
			res, err := deleteAll(ctx, cl.RESTConfig(), ns, svcs, v)
			if err != nil {
				return fmt.Errorf("%s: %w", v.Name, err)
			}
			fmt.Fprintf(out, "| %d | %s | %.2f | %.0f | %.2f | %.2f |\n", rep, v.Name, res.wall, float64(len(svcs))/res.wall,
				res.cpu*1000/float64(len(svcs)), res.cpu/res.wall)
		}
	}
	return nil
}

type result struct{ wall, cpu float64 }

// deleteAll deletes svcs the way v says and measures the wall time and the
// API server's CPU seconds meanwhile.
func deleteAll(ctx context.Context, base *rest.Config, ns string, svcs []*corev1.Service, v variant) (result, error) {
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	for range v.Watchers {
		kc, err := client(base, 50, true)
		if err != nil {
			return result{}, err
		}
		f := informers.NewSharedInformerFactoryWithOptions(kc, 0, informers.WithNamespace(ns))
		inf := f.Core().V1().Services().Informer()
		f.Start(wctx.Done())
		if !cache.WaitForCacheSync(wctx.Done(), inf.HasSynced) {
			return result{}, errors.New("informer did not sync")
		}
	}
	clients := make([]kubernetes.Interface, v.Clients)
	for i := range clients {
		var err error
		if clients[i], err = client(base, -1, v.Protobuf); err != nil {
			return result{}, err
		}
	}
	var limiter flowcontrol.RateLimiter
	if v.Rate > 0 {
		limiter = flowcontrol.NewTokenBucketRateLimiter(float32(v.Rate), 1)
	}
	cpu0, err := load.SampleCPU()
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	var n int
	var mu sync.Mutex
	err = each(ctx, v.InFlight, svcs, func(ctx context.Context, s *corev1.Service) error {
		if limiter != nil {
			if err := limiter.Wait(ctx); err != nil {
				return err
			}
		}
		mu.Lock()
		c := clients[n%len(clients)]
		n++
		mu.Unlock()
		return c.CoreV1().Services(ns).Delete(ctx, s.Name, metav1.DeleteOptions{})
	})
	wall := time.Since(start).Seconds()
	if err != nil {
		return result{}, err
	}
	return result{wall: wall, cpu: cpu0.Since(wall).ByProg[apiServer]}, nil
}

// apiServer is the program whose CPU time is measured (the kernel's comm).
const apiServer = "kube-apiserver"

// apiCores is the CPU use over d of the kube-apiserver this process
// started, in cores.
func apiCores(ctx context.Context, d time.Duration) (float64, error) {
	s, err := load.SampleCPU()
	if err != nil {
		return 0, err
	}
	select {
	case <-ctx.Done():
		return 0, context.Cause(ctx)
	case <-time.After(d):
	}
	return s.Since(d.Seconds()).ByProg[apiServer] / d.Seconds(), nil
}

// each runs call for every Service with k calls in flight (load.InParallel)
// and returns the first error, after all calls ended.
func each(ctx context.Context, k int, svcs []*corev1.Service, call func(context.Context, *corev1.Service) error) error {
	var (
		mu    sync.Mutex
		first error
	)
	load.InParallel(ctx, k, len(svcs), func(ctx context.Context, i int) error {
		err := call(ctx, svcs[i])
		if err != nil {
			mu.Lock()
			if first == nil {
				first = fmt.Errorf("%s: %w", svcs[i].Name, err)
			}
			mu.Unlock()
		}
		return err
	})
	if first == nil && ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return first
}

// client is a clientset for base with a client-side limit of qps (-1: none).
func client(base *rest.Config, qps float32, protobuf bool) (kubernetes.Interface, error) {
	cfg := rest.CopyConfig(base)
	cfg.QPS, cfg.Burst = qps, max(1, int(2*qps))
	if protobuf {
		cfg.ContentType = "application/vnd.kubernetes.protobuf"
		cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	}
	return kubernetes.NewForConfig(cfg)
}

// services are n ClusterIP Services with fixed IPs in 10.100.0.0/16.
func services(ns string, n int) []*corev1.Service {
	out := make([]*corev1.Service, n)
	for i := range out {
		out[i] = &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "svc-" + strconv.Itoa(i), Namespace: ns, Labels: map[string]string{"app": "apicost"}},
			Spec: corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.100.%d.%d", i/250, i%250+1),
				Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(443)}}},
		}
	}
	return out
}
