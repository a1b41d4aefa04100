package main

import (
	"context"
	"fmt"
	"time"

	"github.com/matbus/matbus/internal/cliflag"
	"github.com/matbus/matbus/internal/reload"
	"github.com/matbus/matbus/matsim"
)

// fleetOpts are the flags of a generated fleet.
type fleetOpts struct {
	hosts, dpus, switches, shelves int
	ipmi, ssh                      bool
	subnet, nvosSubnet             string
	seed                           int64
}

func (o *fleetOpts) register(fsVar interface {
	IntVar(*int, string, int, string)
	BoolVar(*bool, string, bool, string)
	StringVar(*string, string, string, string)
	Int64Var(*int64, string, int64, string)
}) {
	fsVar.IntVar(&o.hosts, "hosts", 4, "simulated hosts")
	fsVar.IntVar(&o.dpus, "dpus-per-host", 1, "DPUs per host")
	fsVar.IntVar(&o.switches, "switches", 1, "simulated switches")
	fsVar.IntVar(&o.shelves, "power-shelves", 1, "simulated power shelves")
	fsVar.BoolVar(&o.ipmi, "ipmi", true, "hosts advertise an IPMI endpoint (dynamic ports)")
	fsVar.BoolVar(&o.ssh, "ssh", false, "devices advertise an SSH console")
	fsVar.StringVar(&o.subnet, "bmc-subnet", "10.96.64.0/20", "CIDR the BMC IPs are taken from")
	fsVar.StringVar(&o.nvosSubnet, "nvos-subnet", "", "CIDR the switches' NVOS IPs are taken from, at their BMC IP's offset: at least as large as --bmc-subnet and outside it (default: --bmc-subnet moved up by 2 in its second octet, e.g. 10.98.64.0/20 for 10.96.64.0/20)")
	fsVar.Int64Var(&o.seed, "seed", 1, "seed of the generated ids")
}

func (o *fleetOpts) spec() matsim.FleetSpec {
	return matsim.FleetSpec{Hosts: o.hosts, DPUsPerHost: o.dpus, Switches: o.switches, PowerShelves: o.shelves,
		IPMI: o.ipmi, SSH: o.ssh, BMCSubnet: o.subnet, NVOSSubnet: o.nvosSubnet, Seed: o.seed}
}

func runMatsim(ctx context.Context, args []string, e env) error {
	fs := cliflag.NewFlagSet("matsim", "Serve a simulated MAT `GET /machines/status` from a generated fleet or a fixture file.")
	var l logOpts
	var f fleetOpts
	var listen, fixture, fault, certFile, keyFile string
	var tls, legacy, etag bool
	l.register(fs)
	f.register(fs)
	fs.StringVar(&listen, "listen", "127.0.0.1:1266", "address to listen on")
	fs.StringVar(&fixture, "fixture", "", "serve this status file byte for byte instead of a generated fleet")
	fs.BoolVar(&tls, "tls", false, "serve HTTPS with a self-signed certificate made at start (as MAT does)")
	fs.StringVar(&certFile, "tls-cert-file", "", "serve HTTPS with this PEM certificate chain instead (e.g. a cert-manager Secret's tls.crt); needs --tls-key-file; a renewed pair is served from the next TLS handshake")
	fs.StringVar(&keyFile, "tls-key-file", "", "PEM private key of --tls-cert-file (e.g. tls.key)")
	fs.BoolVar(&legacy, "legacy", false, "serve the legacy schema (machines[] only)")
	fs.BoolVar(&etag, "etag", true, "send a strong ETag per body and answer a matching If-None-Match with 304 Not Modified (false: a MAT without conditional requests, body rendered per request)")
	fs.StringVar(&fault, "fault", "none", "fault to inject: none, 500, malformed, slow, hang")
	if err := cliflag.Parse(fs, args, e.lookupEnv); err != nil {
		return usageErr(err)
	}
	log, err := l.logger(e.stderr)
	if err != nil {
		return err
	}
	fm, err := matsim.ParseFaultMode(fault)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if (certFile == "") != (keyFile == "") {
		return fmt.Errorf("%w: --tls-cert-file and --tls-key-file go together: set both or neither", errUsage)
	}
	if certFile != "" {
		for _, f := range []struct{ label, path string }{{"--tls-cert-file " + certFile, certFile}, {"--tls-key-file " + keyFile, keyFile}} {
			if err := reload.CheckReadable(f.label, f.path); err != nil {
				return err
			}
		}
	}
	opts := matsim.Options{TLS: tls, Legacy: legacy, FixturePath: fixture, Logger: log, TLSCertFile: certFile, TLSKeyFile: keyFile, DisableETag: !etag}
	if fixture == "" {
		fleet, err := matsim.Generate(f.spec())
		if err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		opts.Fleet = fleet
	}
	sim, err := matsim.New(opts)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	sim.SetFault(fm)
	url, err := sim.Start(ctx, listen)
	if err != nil {
		return err
	}
	log.Info("matsim serving", "url", url+"/machines/status", "devices", sim.Devices(), "bmcs", sim.BMCs(), "tls", sim.Certificate() != nil, "legacy", legacy, "etag", etag)
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = cctx
	return sim.Close()
}
