package matsim

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"

	"github.com/matbus/matbus/matclient"
)

// DefaultBMCSubnet is the subnet BMC IPs are taken from when
// FleetSpec.BMCSubnet is empty.
const DefaultBMCSubnet = "10.96.64.0/18"

// Limits of a generated fleet.
const (
	MaxDPUsPerHost = 16
	redfishPort    = 443  // what clients use
	bmcMockPort    = 1266 // what MAT's bmc-mock listens on
	ipmiBasePort   = 16000
	hostSSHPort    = 2222
	dpuSSHBasePort = 34000
)

// ErrInvalidSpec is wrapped by Generate for a FleetSpec it cannot build.
var ErrInvalidSpec = errors.New("matsim: invalid fleet spec")

// FleetSpec describes a fleet to generate.
type FleetSpec struct {
	// Hosts, DPUsPerHost (0..16), Switches and PowerShelves are device
	// counts; all must be >= 0.
	Hosts, DPUsPerHost, Switches, PowerShelves int
	// IPMI gives every host an IPMI endpoint with dynamic ports
	// (reachable == listen == 16000 + host index), like MAT configured for
	// the Kubernetes controller.
	IPMI bool
	// SSH gives hosts the shared SSH port 2222 and each DPU its own port
	// 34000 + DPU index.
	SSH bool
	// BMCSubnet is the IPv4 CIDR the BMC IPs are taken from, sequentially,
	// skipping the network (and, up to /30, broadcast) address. Default
	// DefaultBMCSubnet. Give fleets that run side by side different subnets.
	BMCSubnet string
	// NVOSSubnet is the IPv4 CIDR the switches' NVOS IPs are taken from:
	// a switch's NVOS IP has the same offset in it as its BMC IP has in
	// BMCSubnet, so it must be at least as large as BMCSubnet and must not
	// overlap it. Default: BMCSubnet moved up by 2 in its second octet
	// (10.96.64.0/18 gives 10.98.64.0/18), so fleets with BMC subnets that
	// do not overlap get NVOS IPs that do not overlap either.
	NVOSSubnet string
	// Seed makes the fleet deterministic: the same spec gives the same
	// fleet. IDs depend on the seed and the subnet, so fleets that differ in
	// either have different mat_ids.
	Seed int64
}

// Fleet is the set of devices a simulated MAT instance reports. Machines
// are the top-level devices in MAT's registry order (hosts, then switches,
// then power shelves) with DPUs nested under their host, exactly as
// matclient.Decode returns them. Fields map 1:1 to the status schema.
type Fleet struct {
	InventoryID string
	Machines    []matclient.Device
}

// Clone returns a deep copy of f.
func (f *Fleet) Clone() *Fleet {
	if f == nil {
		return nil
	}
	return &Fleet{InventoryID: f.InventoryID, Machines: cloneDevices(f.Machines)}
}

func cloneDevices(ds []matclient.Device) []matclient.Device {
	if ds == nil {
		return nil
	}
	out := make([]matclient.Device, len(ds))
	for i, d := range ds {
		out[i] = d
		out[i].InfinibandPorts = slices.Clone(d.InfinibandPorts)
		if d.BMC.IPMI != nil {
			ep := *d.BMC.IPMI
			out[i].BMC.IPMI = &ep
		}
		if d.BMC.SSH != nil {
			ep := *d.BMC.SSH
			out[i].BMC.SSH = &ep
		}
		out[i].DPUs = cloneDevices(d.DPUs)
	}
	return out
}

// Status returns f as a v2 matclient.Status (a deep copy) with the given
// generation.
func (f *Fleet) Status(epochID string, generation uint64) *matclient.Status {
	ms := cloneDevices(f.Machines)
	if ms == nil {
		ms = []matclient.Device{}
	}
	return &matclient.Status{
		Schema:      matclient.SchemaV2,
		InventoryID: f.InventoryID,
		EpochID:     epochID,
		Generation:  generation,
		Machines:    ms,
	}
}

// Validate checks that f is something MAT could report (see
// matclient.Status.Validate): unique non-empty mat_ids, DPUs only under
// hosts, valid ports and IPv4 addresses.
func (f *Fleet) Validate() error {
	if f == nil {
		return errors.New("matsim: nil fleet")
	}
	return f.Status("", 1).Validate()
}

// Devices returns the number of devices of every kind, DPUs included.
func (f *Fleet) Devices() int {
	n := 0
	walk(f.Machines, func(*matclient.Device) { n++ })
	return n
}

// BMCs returns the number of devices whose BMC has an IP, i.e. how many
// BMC Services a controller should create for f (if no two share an IP).
func (f *Fleet) BMCs() int {
	n := 0
	walk(f.Machines, func(d *matclient.Device) {
		if d.BMC.IP != "" {
			n++
		}
	})
	return n
}

// NVOSIPs returns the number of switches that report an NVOS IP, i.e. how
// many NVOS Services a controller should create for f.
func (f *Fleet) NVOSIPs() int {
	n := 0
	walk(f.Machines, func(d *matclient.Device) {
		if d.Kind == matclient.KindSwitch && d.NvosIP != "" {
			n++
		}
	})
	return n
}

// MatIDs returns every mat_id in body order (hosts before their DPUs).
func (f *Fleet) MatIDs() []string {
	var ids []string
	walk(f.Machines, func(d *matclient.Device) { ids = append(ids, d.MatID) })
	return ids
}

func walk(ds []matclient.Device, fn func(*matclient.Device)) {
	for i := range ds {
		fn(&ds[i])
		walk(ds[i].DPUs, fn)
	}
}

// fingerprint is MAT's inventory fingerprint: the top-level devices of kind
// machine, sorted by mat_id, each reduced to mat_id, machine_id,
// hardware_type and its InfiniBand ports (sorted by GUID, with state). MAT
// bumps the generation when it changes; BMC IPs, states, DPUs, switches and
// power shelves are not part of it.
func fingerprint(ms []matclient.Device) string {
	type host struct {
		id, rest string
	}
	var hosts []host
	for _, d := range ms {
		if d.Kind != matclient.KindMachine {
			continue
		}
		ports := slices.Clone(d.InfinibandPorts)
		slices.SortFunc(ports, func(a, b matclient.IBPort) int { return strings.Compare(a.GUID, b.GUID) })
		var b strings.Builder
		fmt.Fprintf(&b, "%q %q %d", d.MachineID, d.HardwareType, len(ports))
		for _, p := range ports {
			fmt.Fprintf(&b, " %q=%q", p.GUID, p.State)
		}
		hosts = append(hosts, host{d.MatID, b.String()})
	}
	slices.SortFunc(hosts, func(a, b host) int { return strings.Compare(a.id, b.id) })
	var b strings.Builder
	for _, h := range hosts {
		fmt.Fprintf(&b, "%q %s\n", h.id, h.rest)
	}
	return b.String()
}

var (
	hostHardware = []string{
		"wiwynn_gb200_nvl", "nvidia_dgx_gb300", "lenovo_gb300_nvl", "supermicro_gb300_nvl",
		"dell_poweredge_r750", "nvidia_dgx_h100", "hpe_proliant_dl380a_gen11", "dell_poweredge_r760_bf4",
	}
	switchHardware = []string{"nvidia_switch_nd5200_ld", "nvidia_switch_n5700_ld"}
	shelfHardware  = []string{"liteon_power_shelf", "delta_power_shelf"}
)

// hasInfiniBand tells which host models get InfiniBand ports.
func hasInfiniBand(hw string) bool {
	return strings.Contains(hw, "gb200") || strings.Contains(hw, "gb300") || strings.Contains(hw, "dgx")
}

// Generate builds a deterministic fleet from spec: UUID-v4-shaped mat_ids
// and NICo-like machine IDs from the seed, BMC IPs allocated sequentially
// from the subnet in body order (each host, then its DPUs; then switches;
// then power shelves), redfish 443 -> 1266 everywhere, IPMI and SSH as the
// spec says, machine IPs 10.100.x.y where x.y are the low 16 bits of the
// device's BMC IP, and NVOS IPs at the BMC IP's offset in the NVOS subnet
// (see FleetSpec.NVOSSubnet). Errors wrap ErrInvalidSpec.
func Generate(spec FleetSpec) (*Fleet, error) {
	for _, c := range []struct {
		name string
		n    int
	}{{"hosts", spec.Hosts}, {"DPUs per host", spec.DPUsPerHost}, {"switches", spec.Switches}, {"power shelves", spec.PowerShelves}} {
		if c.n < 0 {
			return nil, fmt.Errorf("%w: %d %s: a device count must be 0 or more", ErrInvalidSpec, c.n, c.name)
		}
	}
	if spec.DPUsPerHost > MaxDPUsPerHost {
		return nil, fmt.Errorf("%w: %d DPUs per host (max %d)", ErrInvalidSpec, spec.DPUsPerHost, MaxDPUsPerHost)
	}
	if spec.BMCSubnet == "" {
		spec.BMCSubnet = DefaultBMCSubnet
	}
	prefix, err := netip.ParsePrefix(spec.BMCSubnet)
	if err != nil || !prefix.Addr().Is4() {
		return nil, fmt.Errorf("%w: BMCSubnet %q is not an IPv4 CIDR", ErrInvalidSpec, spec.BMCSubnet)
	}
	prefix = prefix.Masked()
	var nvos netip.Prefix
	if spec.Switches > 0 || spec.NVOSSubnet != "" {
		if nvos, err = nvosSubnet(prefix, spec.NVOSSubnet); err != nil {
			return nil, err
		}
	}
	dpus := spec.Hosts * spec.DPUsPerHost
	total := spec.Hosts + dpus + spec.Switches + spec.PowerShelves
	if usable := usableAddrs(prefix); uint64(total) > usable {
		return nil, fmt.Errorf("%w: %d devices do not fit in %s (%d addresses)", ErrInvalidSpec, total, prefix, usable)
	}
	if spec.IPMI && ipmiBasePort+spec.Hosts-1 > 65535 {
		return nil, fmt.Errorf("%w: %d hosts exceed the IPMI port range", ErrInvalidSpec, spec.Hosts)
	}
	if spec.SSH && dpuSSHBasePort+dpus-1 > 65535 {
		return nil, fmt.Errorf("%w: %d DPUs exceed the SSH port range", ErrInvalidSpec, dpus)
	}

	// The subnet is mixed into the seed so that two fleets with the same
	// seed but different subnets still get different IDs.
	h := fnv.New64a()
	_, _ = h.Write([]byte(prefix.String()))
	g := &gen{
		rng:  rand.New(rand.NewPCG(uint64(spec.Seed), h.Sum64())),
		next: prefix.Addr().Next(), // skip the network address
		ids:  make(map[string]bool, total),
	}
	mac := g.rng.Uint32()
	fleet := &Fleet{
		InventoryID: fmt.Sprintf("mat-02:%02x:%02x:00:00:00", byte(mac>>8), byte(mac)),
		Machines:    make([]matclient.Device, 0, spec.Hosts+spec.Switches+spec.PowerShelves),
	}
	redfish := matclient.Endpoint{ReachablePort: redfishPort, ListenPort: bmcMockPort}

	dpuIndex := 0
	for i := range spec.Hosts {
		hw := hostHardware[i%len(hostHardware)]
		host := matclient.Device{
			MatID:        g.uuid(),
			Kind:         matclient.KindMachine,
			MachineID:    g.machineID("fm100ht"),
			HardwareType: hw,
			MatState:     "MachineUp",
			APIState:     "Ready",
			PowerState:   "On",
			BMC:          matclient.BMC{IP: g.ip(), Redfish: redfish},
		}
		host.DeviceID = host.MachineID
		host.MachineIP = lowBits("10.100.0.0", host.BMC.IP)
		if hasInfiniBand(hw) {
			base := g.rng.Uint32() &^ 0xff
			host.InfinibandPorts = []matclient.IBPort{
				{GUID: fmt.Sprintf("0002c903%08x", base), State: "active"},
				{GUID: fmt.Sprintf("0002c903%08x", base+1), State: "active"},
			}
		}
		if spec.IPMI {
			p := uint16(ipmiBasePort + i)
			host.BMC.IPMI = &matclient.Endpoint{ReachablePort: p, ListenPort: p}
		}
		if spec.SSH {
			host.BMC.SSH = &matclient.Endpoint{ReachablePort: hostSSHPort, ListenPort: hostSSHPort}
		}
		for range spec.DPUsPerHost {
			dpu := matclient.Device{
				MatID:      g.uuid(),
				Kind:       matclient.KindDPU,
				MachineID:  g.machineID("fm100ds"),
				MatState:   "MachineUp",
				APIState:   "Ready",
				PowerState: "On",
				BMC:        matclient.BMC{IP: g.ip(), Redfish: redfish},
			}
			dpu.DeviceID = dpu.MachineID
			dpu.MachineIP = lowBits("10.100.0.0", dpu.BMC.IP)
			if spec.SSH {
				p := uint16(dpuSSHBasePort + dpuIndex)
				dpu.BMC.SSH = &matclient.Endpoint{ReachablePort: p, ListenPort: p}
			}
			dpuIndex++
			host.DPUs = append(host.DPUs, dpu)
		}
		fleet.Machines = append(fleet.Machines, host)
	}
	for i := range spec.Switches {
		sw := matclient.Device{
			MatID:        g.uuid(),
			Kind:         matclient.KindSwitch,
			HardwareType: switchHardware[i%len(switchHardware)],
			MatState:     "DeviceUp",
			APIState:     "Unknown",
			PowerState:   "On",
			BMC:          matclient.BMC{IP: g.ip(), Redfish: redfish},
		}
		sw.DeviceID = sw.MatID
		sw.NvosIP = sameOffset(prefix, nvos, sw.BMC.IP)
		fleet.Machines = append(fleet.Machines, sw)
	}
	for i := range spec.PowerShelves {
		ps := matclient.Device{
			MatID:        g.uuid(),
			Kind:         matclient.KindPowerShelf,
			HardwareType: shelfHardware[i%len(shelfHardware)],
			MatState:     "BmcOnly/DeviceUp",
			APIState:     "Unknown",
			PowerState:   "On",
			BMC:          matclient.BMC{IP: g.ip(), Redfish: redfish},
		}
		ps.DeviceID = ps.MatID
		fleet.Machines = append(fleet.Machines, ps)
	}
	return fleet, nil
}

// usableAddrs is the number of host addresses Generate can take from p.
func usableAddrs(p netip.Prefix) uint64 {
	size := uint64(1) << (32 - p.Bits())
	switch {
	case p.Bits() == 32:
		return 0 // only the network address, which is skipped
	case p.Bits() == 31:
		return 1 // RFC 3021: no broadcast, network skipped
	}
	return size - 2
}

type gen struct {
	rng  *rand.Rand
	next netip.Addr
	ids  map[string]bool
}

// uuid returns a fresh random UUID v4 string (lower case, hyphenated).
func (g *gen) uuid() string {
	for {
		var b [16]byte
		for i := 0; i < 16; i += 8 {
			v := g.rng.Uint64()
			for j := range 8 {
				b[i+j] = byte(v >> (8 * j))
			}
		}
		b[6] = b[6]&0x0f | 0x40 // version 4
		b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
		id := fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
		if !g.ids[id] {
			g.ids[id] = true
			return id
		}
	}
}

// machineID returns a 59-character NICo-like machine ID with the prefix.
func (g *gen) machineID(prefix string) string {
	const alphabet = "0123456789abcdefghijklmnopqrstuv"
	b := []byte(prefix)
	for len(b) < 59 {
		b = append(b, alphabet[g.rng.IntN(len(alphabet))])
	}
	return string(b)
}

// ip returns the next BMC IP. Generate checked that it fits.
func (g *gen) ip() string {
	a := g.next
	g.next = a.Next()
	return a.String()
}

// nvosSubnet returns the NVOS subnet of a fleet whose BMC subnet is bmc:
// spec parsed, or, when spec is empty, bmc moved up by 2 in its second
// octet. It must be an IPv4 CIDR at least as large as bmc that does not
// overlap it (errors wrap ErrInvalidSpec and name what to change).
func nvosSubnet(bmc netip.Prefix, spec string) (netip.Prefix, error) {
	if spec == "" {
		a := bmc.Addr().As4()
		if a[1] > 253 {
			return netip.Prefix{}, fmt.Errorf("%w: no default NVOS subnet for BMC subnet %s (its second octet + 2 exceeds 255): set the NVOS subnet", ErrInvalidSpec, bmc)
		}
		a[1] += 2
		p := netip.PrefixFrom(netip.AddrFrom4(a), bmc.Bits()).Masked()
		if p.Overlaps(bmc) {
			return netip.Prefix{}, fmt.Errorf("%w: BMC subnet %s is too large for the default NVOS subnet (%s overlaps it): set an NVOS subnet of the same size outside it", ErrInvalidSpec, bmc, p)
		}
		return p, nil
	}
	p, err := netip.ParsePrefix(spec)
	if err != nil || !p.Addr().Is4() {
		return netip.Prefix{}, fmt.Errorf("%w: NVOS subnet %q is not an IPv4 CIDR", ErrInvalidSpec, spec)
	}
	p = p.Masked()
	if p.Bits() > bmc.Bits() {
		return netip.Prefix{}, fmt.Errorf("%w: NVOS subnet %s is smaller than BMC subnet %s: a switch's NVOS IP has its BMC IP's offset, so give it at least /%d", ErrInvalidSpec, p, bmc, bmc.Bits())
	}
	if p.Overlaps(bmc) {
		return netip.Prefix{}, fmt.Errorf("%w: NVOS subnet %s overlaps BMC subnet %s: NVOS IPs would be BMC IPs", ErrInvalidSpec, p, bmc)
	}
	return p, nil
}

// sameOffset returns the address of to that has ip's offset in from.
func sameOffset(from, to netip.Prefix, ip string) string {
	a, f, t := netip.MustParseAddr(ip).As4(), from.Addr().As4(), to.Addr().As4()
	u := func(b [4]byte) uint32 { return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) }
	v := u(t) + (u(a) - u(f))
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
}

// lowBits returns base (a /16) plus the low 16 bits of ip.
func lowBits(base, ip string) string {
	b := netip.MustParseAddr(base).As4()
	a := netip.MustParseAddr(ip).As4()
	return netip.AddrFrom4([4]byte{b[0], b[1], a[2], a[3]}).String()
}
