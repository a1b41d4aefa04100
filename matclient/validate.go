package matclient

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Validate checks the invariants that Decode guarantees for every Status it
// returns, so that a Status built or changed by hand (tests, simulators,
// fuzzing) can be checked the same way:
//
//   - Schema is SchemaLegacy or SchemaV2; a legacy Status has no
//     InventoryID, EpochID or Generation;
//   - Machines is non-nil (an instance without devices has an empty slice);
//   - every device has a non-empty MatID, unique across the whole Status;
//   - top-level devices are machine, switch or power_shelf; nested ones are
//     dpu, and only machines have nested devices;
//   - every port is in 1..65535; BMC.IP, MachineIP and NvosIP are "" or a
//     canonical IPv4 address;
//   - every Invalid entry has a Path "machines[i]" or "machines[i].dpus[j]"
//     and a non-empty Reason, the entries are in body order (strictly
//     increasing positions, a host before its DPUs), and no device of
//     Machines has the (non-empty) MatID of an Invalid entry.
//
// It returns a *DecodeError wrapping ErrInvalidStatus naming the first
// violation, or nil.
func (s *Status) Validate() error {
	if s == nil {
		return invalid("", "nil status")
	}
	switch s.Schema {
	case SchemaLegacy:
		if s.InventoryID != "" || s.EpochID != "" || s.Generation != 0 {
			return invalid("", "legacy status with inventory identity")
		}
	case SchemaV2:
	default:
		return invalid("", "unknown schema %d", int(s.Schema))
	}
	if s.Machines == nil {
		return invalid("machines", "nil")
	}
	seen := make(map[string]string)
	var check func(ds []Device, prefix string, nested bool) error
	check = func(ds []Device, prefix string, nested bool) error {
		for i := range ds {
			d := &ds[i]
			pos := prefix + "[" + strconv.Itoa(i) + "]"
			if d.MatID == "" {
				return invalid(pos+".mat_id", "empty")
			}
			label := pos + " (mat_id " + d.MatID + ")"
			if first, dup := seen[d.MatID]; dup {
				return invalid(label+".mat_id", "duplicate mat_id, also at %s", first)
			}
			seen[d.MatID] = pos
			if !d.Kind.Valid() {
				return invalid(label+".device_kind", "unknown device kind %q", d.Kind)
			}
			if nested != (d.Kind == KindDPU) {
				return invalid(label+".device_kind", "%q at nesting level nested=%t", d.Kind, nested)
			}
			if len(d.DPUs) > 0 && d.Kind != KindMachine {
				return invalid(label+".dpus", "a %s cannot have dpus", d.Kind)
			}
			for _, ip := range []struct{ name, v string }{
				{"bmc.ip", d.BMC.IP}, {"machine_ip", d.MachineIP}, {"nvos_ip", d.NvosIP},
			} {
				if ip.v == "" {
					continue
				}
				a, err := netip.ParseAddr(ip.v)
				if err != nil || !a.Is4() || a.String() != ip.v {
					return invalid(label+"."+ip.name, "%q is not an IPv4 address", ip.v)
				}
			}
			eps := []struct {
				name string
				ep   *Endpoint
			}{{"redfish", &d.BMC.Redfish}, {"ipmi", d.BMC.IPMI}, {"ssh", d.BMC.SSH}}
			for _, e := range eps {
				if e.ep == nil {
					continue
				}
				if e.ep.ReachablePort == 0 {
					return invalid(label+".bmc."+e.name+".reachable_port", "0 is out of range 1..65535")
				}
				if e.ep.ListenPort == 0 {
					return invalid(label+".bmc."+e.name+".listen_port", "0 is out of range 1..65535")
				}
			}
			if err := check(d.DPUs, label+".dpus", true); err != nil {
				return err
			}
		}
		return nil
	}
	if err := check(s.Machines, "machines", false); err != nil {
		return err
	}
	var prev []int
	for i, inv := range s.Invalid {
		p := "invalid[" + strconv.Itoa(i) + "]"
		pos, ok := devicePosition(inv.Path)
		switch {
		case !ok:
			return invalid(p+".path", "%q is not machines[i] or machines[i].dpus[j]", inv.Path)
		case inv.Reason == "":
			return invalid(p+".reason", "empty")
		case i > 0 && slices.Compare(prev, pos) >= 0:
			return invalid(p+".path", "%s is not after %s in body order", inv.Path, s.Invalid[i-1].Path)
		}
		if at, dup := seen[inv.MatID]; dup && inv.MatID != "" {
			return invalid(p+".mat_id", "%q is also the mat_id of the valid device at %s", inv.MatID, at)
		}
		prev = pos
	}
	return nil
}

// devicePosition parses "machines[i]" or "machines[i].dpus[j]" into [i]
// or [i, j].
func devicePosition(path string) ([]int, bool) {
	rest, ok := strings.CutPrefix(path, "machines[")
	if !ok {
		return nil, false
	}
	var pos []int
	for {
		num, after, ok := strings.Cut(rest, "]")
		if !ok || num == "" || len(num) > 1 && num[0] == '0' {
			return nil, false
		}
		n, err := strconv.Atoi(num)
		if err != nil || n < 0 {
			return nil, false
		}
		pos = append(pos, n)
		if after == "" {
			return pos, true
		}
		if rest, ok = strings.CutPrefix(after, ".dpus["); !ok || len(pos) == 2 {
			return nil, false
		}
	}
}

// Counts is the number of devices of each kind in a Status, and how many of
// them have a BMC IP (and so can get a Service).
type Counts struct {
	Machines, DPUs, Switches, PowerShelves int
	// WithBMCIP counts devices of every kind whose BMC has an IP.
	WithBMCIP int
}

// Total is the number of devices of all kinds.
func (c Counts) Total() int { return c.Machines + c.DPUs + c.Switches + c.PowerShelves }

// Counts walks s and counts its devices by kind.
func (s *Status) Counts() Counts {
	var c Counts
	s.Walk(func(d *Device, _ *Device) {
		switch d.Kind {
		case KindMachine:
			c.Machines++
		case KindDPU:
			c.DPUs++
		case KindSwitch:
			c.Switches++
		case KindPowerShelf:
			c.PowerShelves++
		}
		if d.BMC.IP != "" {
			c.WithBMCIP++
		}
	})
	return c
}
