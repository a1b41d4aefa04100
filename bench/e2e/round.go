package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
)

// settle is the pause between the last reaction and the steady window.
const settle = 2 * time.Second

// round runs the scenario once with r.Workers workers: fresh namespace,
// nats-server and simulators; workers started and ready; then converge,
// grow, shrink, reactions, the steady window and the delete fan-out, in
// that order. A wait that runs out is recorded and the round goes on.
func (b *bench) round(ctx context.Context, r *roundResult) error {
	idx := len(b.result.Rounds)
	tag := fmt.Sprintf("w=%d", r.Workers)
	if b.cfg.Repeat > 1 {
		tag = fmt.Sprintf("rep %d, w=%d", r.Repeat, r.Workers)
	}
	ns := fmt.Sprintf("bench-r%d-w%d", idx, r.Workers)
	dir := filepath.Join(b.dir, fmt.Sprintf("round%d-w%d", idx, r.Workers))
	if err := mkdir(dir); err != nil {
		return err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the informer and every process of the round
	if err := b.createNamespace(rctx, ns); err != nil {
		return err
	}
	defer b.cleanNamespace(ns)

	profiling := b.cfg.PprofDir != "" // CPU profiles of every process (--pprof-dir)
	nproc, natsURL, err := startNATS(rctx, b.cfg.NATSServer, dir, "nats-server", profiling)
	if err != nil {
		return err
	}
	defer nproc.Stop()

	// The simulators run in a process of their own (simhost.go).
	host, err := startSimHost(rctx, dir, "matsim", b.fleets.base, b.cfg.MATNoETag)
	if err != nil {
		return err
	}
	defer host.Stop()
	sims := host.simulators()
	cur := make([]*matsim.Fleet, len(b.fleets.base))
	var static []string
	for i, fl := range b.fleets.base {
		cur[i] = fl.Clone()
		static = append(static, "mat-"+strconv.Itoa(i)+"="+host.urls[i])
	}

	tr, err := startTracker(rctx, b.watch, ns)
	if err != nil {
		return err
	}

	var workers []*proc
	defer func() {
		for _, p := range workers {
			p.Stop()
		}
	}()
	t := time.Now()
	for i := range r.Workers {
		health, err := freeAddr()
		if err != nil {
			return err
		}
		name := "worker-" + strconv.Itoa(i)
		args := []string{"worker", "--nats-url", natsURL, "--kubeconfig", b.cluster.Kubeconfig,
			"--namespace", ns, "--worker-name", name, "--health-addr", health, "--insecure-skip-verify",
			// The delete fan-out empties every simulator on purpose and
			// measures the deletes themselves, not the hold of a mass
			// disappearance (ADR 26).
			"--delete-hold-window=0"}
		if profiling {
			args = append(args, "--profiling")
		}
		p, err := b.startMatbus(rctx, dir, name, append(args, b.cfg.WorkerArgs...)...)
		if err != nil {
			return err
		}
		p.health = health
		if profiling {
			p.pprof = health
		}
		workers = append(workers, p)
	}
	for _, p := range workers {
		if err := p.WaitReady(rctx, 2*time.Minute); err != nil {
			return err
		}
	}
	b.logf("%s: %d worker(s) ready in %s", tag, r.Workers, since(t))
	r.Scale = &roundScale{}
	snap := b.snapshot(rctx, workers)

	// 1. converge from empty: discovery starts now.
	all := allNames(cur)
	r.Services = len(all)
	w := tr.Expect(all, true)
	health, err := freeAddr()
	if err != nil {
		return err
	}
	args := []string{"discovery", "--nats-url", natsURL, "--namespace", ns, "--identity", "discovery",
		"--health-addr", health, "--leader-elect=false", "--static", strings.Join(static, ",")}
	if b.cfg.SyncInterval > 0 {
		args = append(args, "--sync-interval", b.cfg.SyncInterval.String())
	}
	if profiling {
		args = append(args, "--profiling")
	}
	convergeAudit := b.audit.Offset()
	t0 := time.Now()
	ccpu, _ := b.sampleCPU()
	disc, err := b.startMatbus(rctx, dir, "discovery", append(args, b.cfg.DiscoveryArgs...)...)
	if err != nil {
		return err
	}
	defer disc.Stop()
	if profiling {
		disc.pprof = health
	}
	prof := b.profile(rctx, fmt.Sprintf("r%d w%d converge", idx, r.Workers), append([]*proc{nproc, disc}, workers...)...)
	// alive ends a wait early when a matbus process has exited.
	alive := func() error {
		for _, p := range append(slices.Clone(workers), disc) {
			if p.Exited() {
				return fmt.Errorf("%s exited (%v); its log ends:\n%s", p.name, p.waitErr, p.Tail(10))
			}
		}
		return nil
	}
	r.Converge = b.await(rctx, tr, w, t0, alive, tag, fmt.Sprintf("converge: %d Services", len(all)))
	r.Scale.ConvergeCPU = ccpu.Since(time.Since(t0).Seconds())
	next := b.snapshot(rctx, workers)
	r.Scale.Converge, snap = deltaOf(snap, next), next
	b.logf("%s: converge CPU: %s", tag, r.Scale.ConvergeCPU)
	if b.audit.path != "" {
		t1 := time.Now()
		time.Sleep(auditGrace)
		if r.Scale.ConvergeAudit, err = b.audit.Window(convergeAudit, t0, t1); err != nil {
			b.logf("%v", err)
		}
	}
	prof()
	if ctx.Err() != nil {
		return nil
	}

	// 2. grow: simulator 0 gains 101 BMCs.
	growNames := serviceNames(b.fleets.grow)
	grown := with(cur[0], b.fleets.grow...)
	w = tr.Expect(growNames, true)
	t0 = time.Now()
	if err := sims[0].SetFleet(grown); err != nil {
		return err
	}
	cur[0] = grown
	r.Grow = b.await(rctx, tr, w, t0, alive, tag, fmt.Sprintf("grow: +%d on mat-0", len(growNames)))
	if ctx.Err() != nil {
		return nil
	}

	// 3. shrink: simulator 0 loses them again.
	w = tr.Expect(growNames, false)
	t0 = time.Now()
	if err := sims[0].SetFleet(b.fleets.base[0]); err != nil {
		return err
	}
	cur[0] = b.fleets.base[0].Clone()
	r.Shrink = b.await(rctx, tr, w, t0, alive, tag, fmt.Sprintf("shrink: -%d on mat-0", len(growNames)))
	if ctx.Err() != nil {
		return nil
	}

	// 5. reactions (before the steady window and the delete, which empty nothing yet).
	snap = b.snapshot(rctx, workers)
	if err := b.reactions(rctx, r, tr, sims, cur, alive, tag); err != nil {
		return err
	}
	r.Scale.Reactions = deltaOf(snap, b.snapshot(rctx, workers))
	if ctx.Err() != nil {
		return nil
	}

	// 6, 7. steady window: nothing changes. It starts settle after the
	// last reaction's watch event: the API server counts a request when
	// it has answered, which can be after the watch event went out.
	mc, err := b.startMATCost(rctx, dir, host, cur) // 9. what MAT pays
	if err != nil {
		return err
	}
	defer mc.Stop()
	select {
	case <-rctx.Done():
		return nil
	case <-time.After(settle):
	}
	t = time.Now()
	var req0, conn0 int64
	api, err := b.apiWindow(rctx, b.cfg.Steady, func(start bool) {
		if !start {
			r.MATCost = mc.end() // before the counter reads below, which cost the simulators CPU
		}
		var req, conn int64
		for _, s := range sims {
			req += s.Requests()
			conn += s.Connections()
		}
		if start {
			req0, conn0 = req, conn
			snap = b.snapshot(rctx, workers)
			mc.begin(rctx)
			return
		}
		b.logf("%s: MAT cost over the steady window (ETags %v):%s", tag, mc.ETag, mc)
		r.Scale.Steady = deltaOf(snap, b.snapshot(rctx, workers))
		for _, p := range workers {
			if rss, _, err := p.Mem(); err == nil {
				r.Scale.SteadyWorkerRSS = max(r.Scale.SteadyWorkerRSS, rss)
			}
		}
		if rss, _, err := disc.Mem(); err == nil {
			r.Scale.SteadyDiscoveryRSS = rss
		}
		n := float64(len(sims))
		r.MATGetsPerInstanceMin = float64(req-req0) / n / time.Since(t).Minutes()
		r.NewConnsPerInstance = float64(conn-conn0) / n
	})
	if err != nil {
		return err
	}
	r.API = &api
	b.logf("%s: steady %s: %.1f API requests/min (%s; %d of the harness), %.2f MAT GETs/instance/min, %.2f new connections/instance",
		tag, since(t), api.PerMinute, orNone(api.Raw.String()), api.Harness, r.MATGetsPerInstanceMin, r.NewConnsPerInstance)
	if ctx.Err() != nil {
		return nil
	}

	// 4. delete fan-out: every device gone from every simulator.
	all = allNames(cur)
	w = tr.Expect(all, false)
	api0, _ := b.scrape(rctx)
	snap = b.snapshot(rctx, workers)
	auditAt := b.audit.Offset()
	t0 = time.Now()
	cpu0, _ := b.sampleCPU()
	prof = b.profile(rctx, fmt.Sprintf("r%d w%d fan-out", idx, r.Workers), append([]*proc{nproc, disc}, workers...)...)
	for i, s := range sims {
		empty := &matsim.Fleet{InventoryID: cur[i].InventoryID}
		if err := s.SetFleet(empty); err != nil {
			return err
		}
		cur[i] = empty
	}
	r.Delete = b.await(rctx, tr, w, t0, alive, tag, fmt.Sprintf("delete fan-out: %d Services", len(all)))
	r.Delete.Count = len(all)
	r.DeleteCPU = cpu0.Since(time.Since(t0).Seconds())
	if api1, err := b.scrape(rctx); err == nil && api0 != nil {
		r.DeleteAPI = api1.Sub(api0)
	}
	b.logf("%s: delete fan-out CPU: %s; API requests answered by the last watch event: %s", tag, r.DeleteCPU, r.DeleteAPI)
	prof()
	r.Scale.Delete = deltaOf(snap, b.snapshot(rctx, workers))
	if b.audit.path != "" {
		t1 := time.Now()
		time.Sleep(auditGrace)
		if r.Scale.DeleteAudit, err = b.audit.Window(auditAt, t0, t1); err != nil {
			b.logf("%v", err)
		}
	}

	// 8. worker memory after the run.
	for _, p := range workers {
		rss, hwm, err := p.Mem()
		if err != nil {
			b.logf("%s: %s memory: %v", tag, p.name, err)
			continue
		}
		r.WorkerRSS, r.WorkerHWM = max(r.WorkerRSS, rss), max(r.WorkerHWM, hwm)
	}
	b.logf("%s: worker RSS max %.1f MiB, VmHWM max %.1f MiB", tag, mib(r.WorkerRSS), mib(r.WorkerHWM))
	if _, hwm, err := disc.Mem(); err == nil {
		r.Scale.DiscoveryHWM = hwm
	}
	for _, n := range scaleNotes(r) {
		b.logf("%s: %s", tag, n)
	}
	if err := b.neighbourRound(rctx, r, tr, sims, cur, alive, tag); err != nil {
		return err
	}
	for _, p := range append(slices.Clone(workers), disc) {
		errs, warns := p.CountLines("level=ERROR"), p.CountLines("level=WARN")
		if errs+warns > 0 {
			r.Notes = append(r.Notes, fmt.Sprintf("%s logged %d ERROR and %d WARN lines", p.name, errs, warns))
		}
	}
	for _, n := range r.Notes {
		b.logf("%s: %s", tag, n)
	}
	return nil
}

// await waits for w (registered before the change made at t0) and records
// the result; it logs the phase's elapsed time.
func (b *bench) await(ctx context.Context, tr *tracker, w *waiter, t0 time.Time, alive func() error, tag, what string) *phase {
	at, missing, err := tr.Wait(ctx, w, t0.Add(b.cfg.Timeout), alive)
	p := &phase{Count: len(w.names)}
	if err != nil {
		p.TimedOut, p.Missing, p.Why = true, missing, err.Error()
		b.logf("%s: %s: %v after %s (%d missing)", tag, what, err, since(t0), missing)
		return p
	}
	p.Seconds = at.Sub(t0).Seconds()
	if !w.first.IsZero() {
		p.First = w.first.Sub(t0).Seconds()
	}
	b.logf("%s: %s in %.2fs (the first after %.2fs)", tag, what, p.Seconds, p.First)
	return p
}

// reactions makes K single-BMC changes on random simulators, spaced by
// 0.5–1.5 s, and records each change's latency to its watch event. The
// changes cycle through: add a host without DPUs, remove a base device
// without DPUs (DPU, switch or power shelf), add a power shelf, remove a
// host added before (whose Service exists; else another base device). MAT
// (and matsim) bump the status generation only when the set of hosts
// changes, so the host changes and the others are also reported apart,
// and made on disjoint instances (even and odd ones; both on the one
// instance of a one-simulator run).
func (b *bench) reactions(ctx context.Context, r *roundResult, tr *tracker, sims []simulator, cur []*matsim.Fleet, alive func() error, tag string) error {
	k := b.cfg.Reactions
	if k == 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(uint64(b.cfg.Seed), 7))
	hosts, shelves := b.fleets.extraHosts, b.fleets.extraShelves
	type addedHost struct {
		inst    int
		dev     matclient.Device
		removed bool
	}
	var added []*addedHost
	extra := map[string]bool{} // mat_ids the reactions added
	type change struct {
		w   *waiter
		t0  time.Time
		rec *reaction
	}
	var changes []change
	start := time.Now()
	// Host changes and the others go to disjoint instances, so that a
	// host change never carries along another change on its instance.
	hostInsts, otherInsts := []int{0}, []int{0}
	if len(sims) > 1 {
		hostInsts, otherInsts = nil, nil
		for i := range sims {
			if i%2 == 0 {
				hostInsts = append(hostInsts, i)
			} else {
				otherInsts = append(otherInsts, i)
			}
		}
	}
	pick := func(insts []int) int { return insts[rng.IntN(len(insts))] }
	for i := range k {
		add := i%2 == 0
		var inst int
		var dev matclient.Device
		switch i % 4 {
		case 0:
			inst, dev, hosts = pick(hostInsts), hosts[0], hosts[1:]
		case 2:
			inst, dev, shelves = pick(otherInsts), shelves[0], shelves[1:]
		case 3:
			var ready []*addedHost
			for _, a := range added {
				if !a.removed && tr.Present(serviceName(&a.dev)) {
					ready = append(ready, a)
				}
			}
			if len(ready) > 0 {
				a := ready[rng.IntN(len(ready))]
				a.removed, inst, dev = true, a.inst, a.dev
			}
		}
		if !add && dev.MatID == "" {
			inst = pick(otherInsts)
			var ok bool
			if dev, ok = baseLeaf(cur[inst], extra, rng); !ok {
				continue
			}
		}
		name := serviceName(&dev)
		rec := &reaction{Instance: inst, Kind: string(plan.MachineTypeOf(dev.Kind)), Op: "remove"}
		w := tr.Expect([]string{name}, add)
		t0 := time.Now()
		if add {
			rec.Op = "add"
			next := with(cur[inst], dev)
			if err := sims[inst].SetFleet(next); err != nil {
				return err
			}
			cur[inst] = next
			extra[dev.MatID] = true
			if dev.Kind == matclient.KindMachine {
				added = append(added, &addedHost{inst: inst, dev: dev})
			}
		} else {
			if err := sims[inst].RemoveDevice(dev.MatID); err != nil {
				return err
			}
			cur[inst] = sims[inst].Fleet()
		}
		changes = append(changes, change{w, t0, rec})
		if i < k-1 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(500*time.Millisecond + time.Duration(rng.Int64N(int64(time.Second)))):
			}
		}
	}
	deadline := time.Now().Add(b.cfg.Timeout)
	res := &reactions{}
	var all, host, other []time.Duration
	for _, c := range changes {
		at, _, err := tr.Wait(ctx, c.w, deadline, alive)
		res.List = append(res.List, c.rec)
		if err != nil {
			continue
		}
		l := at.Sub(c.t0)
		c.rec.Seconds = ptr(l.Seconds())
		all = append(all, l)
		if c.rec.Kind == string(plan.MachineTypeHost) {
			host = append(host, l)
		} else {
			other = append(other, l)
		}
	}
	res.Changes, res.Seen = len(changes), len(all)
	res.All, res.Host, res.Other = summarize(all), summarize(host), summarize(other)
	r.Reactions = res
	b.logf("%s: reactions: %d of %d seen in %s, p50 %.2fs, p99 %.2fs; host changes p50 %.2fs (%d), others p50 %.2fs (%d)",
		tag, len(all), len(changes), since(start), res.All.P50, res.All.P99, res.Host.P50, len(host), res.Other.P50, len(other))
	return nil
}

// baseLeaf picks a random device of fl without DPUs that the reactions did
// not add.
func baseLeaf(fl *matsim.Fleet, extra map[string]bool, rng *rand.Rand) (matclient.Device, bool) {
	var cand []matclient.Device
	for _, d := range leaves(fl) {
		if !extra[d.MatID] {
			cand = append(cand, d)
		}
	}
	if len(cand) == 0 {
		return matclient.Device{}, false
	}
	return cand[rng.IntN(len(cand))], true
}

// summarize returns the count, p50 and p99 of ds (seconds).
func summarize(ds []time.Duration) latencies {
	return latencies{N: len(ds), P50: percentile(ds, 50).Seconds(), P99: percentile(ds, 99).Seconds()}
}

// allNames are the Service names every simulator's fleet asks for.
func allNames(cur []*matsim.Fleet) []string {
	var out []string
	for _, fl := range cur {
		out = append(out, serviceNames(fl.Machines)...)
	}
	return out
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
