package plan

import (
	"fmt"
	"hash/fnv"

	"github.com/matbus/matbus/matclient"
)

// MachineType is the kind of device a Service fronts, as written in
// LabelDeviceKind; LabelMachineType carries its ContractType.
type MachineType string

// Machine types, from matclient.DeviceKind machine, dpu, switch and
// power_shelf.
const (
	MachineTypeHost       MachineType = "host"
	MachineTypeDPU        MachineType = "dpu"
	MachineTypeSwitch     MachineType = "switch"
	MachineTypePowerShelf MachineType = "power-shelf"
	// MachineTypeNVOS is the NVOS Service of a switch (NVOSServiceName),
	// never a device kind.
	MachineTypeNVOS MachineType = "nvos"
)

// MachineTypeOf maps a MAT device kind to its machine type. An unknown kind
// (which matclient.Decode never returns) is a host, as the old controller
// treated every non-DPU.
func MachineTypeOf(k matclient.DeviceKind) MachineType {
	switch k {
	case matclient.KindDPU:
		return MachineTypeDPU
	case matclient.KindSwitch:
		return MachineTypeSwitch
	case matclient.KindPowerShelf:
		return MachineTypePowerShelf
	default:
		return MachineTypeHost
	}
}

// ContractType is the machine type as the old controller writes it in
// LabelMachineType: "dpu", "nvos", and "host" for everything else (hosts,
// switches, power shelves).
func (t MachineType) ContractType() string {
	switch t {
	case MachineTypeDPU, MachineTypeNVOS:
		return string(t)
	}
	return string(MachineTypeHost)
}

// nameToken is the type part of a Service name. The old controller only knew
// host and DPU, and built switches and power shelves as hosts; we keep its
// token so that its Services are adopted under the same names.
func (t MachineType) nameToken() string {
	if t == MachineTypeDPU {
		return "dpu"
	}
	return "host"
}

const (
	// legacyIDBytes is how many bytes of a mat_id the old name rule keeps
	// before it appends a hash.
	legacyIDBytes = 12
	// maxLabelValue is the longest valid label value (and DNS-1035 label).
	maxLabelValue = 63
	// hashLen is the length of hash8's output (the old controller's hash).
	hashLen = 8
	// hash16Len is the length of hash16's output (matbus's own hash).
	hash16Len = 16
	// labelHashSep separates the readable part of a hashed label value from
	// its hash16; "_" never occurs in a DNS-1035 name and rarely in ids.
	labelHashSep = '_'
	// labelHashFallback is the readable part of a hashed label value whose
	// input has no usable byte (a label value must start alphanumeric).
	labelHashFallback = "h"
)

// ServiceName returns the Service name of a device, a valid DNS-1035 label
// of at most 42 bytes:
//
//	mat-bmc-<host|dpu>-<id part>
//
// The type token is "dpu" for DPUs and "host" for everything else (hosts,
// switches, power shelves), as the old controller named them; the two
// prefixes differ, so only ids of the same token can share a name. The id
// part has one of three shapes:
//
//   - kept short (the old controller's rule, mat_id of at most 12 bytes):
//     the mat_id itself, 1..12 bytes of [a-z0-9-] not ending in "-", e.g.
//     "host-abcd-12" → "mat-bmc-host-host-abcd-12";
//   - kept long (the old controller's rule, mat_id of more than 12 bytes):
//     the first 12 bytes (all [a-z0-9-]) + "-" + hash8(mat_id), exactly 21
//     bytes with "-" at byte 12, e.g. "922f3d9b-20be-461f-9b69-90928701ce93"
//     (DPU) → "mat-bmc-dpu-922f3d9b-20b-4da64654";
//   - hashed (every id whose old name is not a valid DNS-1035 label: upper
//     case, "_", ".", a trailing "-", non-ASCII, empty, …): x + "-" +
//     hash16(mat_id), where x is the id lower-cased, every run of bytes
//     outside [a-z0-9] made one "-", "-" trimmed from both ends, cut to at
//     most 12 bytes (trailing "-" trimmed again); just hash16(mat_id) when x
//     is empty. E.g. "Node_7" → "mat-bmc-host-node-7-cfa945d5fb439053",
//     "3F2B6C1E-8A4D-4C2B-9E7F-0A1B2C3D4E5F" →
//     "mat-bmc-host-3f2b6c1e-8a4-f3c62d8062c59e54", "" →
//     "mat-bmc-host-cbf29ce484222325".
//
// The kept names are exactly the old controller's wherever those are valid,
// so an old install is adopted without churn. A hashed id part is 16 or
// 18..29 bytes and ends in 16 hex digits: it is never 12 bytes or shorter,
// and when it is 21 bytes (x of 4 bytes) its byte 12 is a hex digit, not
// "-". So a hashed name never equals a kept name, and two distinct mat_ids
// share a name only when both are kept long with equal first 12 bytes and
// an FNV-1a-32 collision, or both are hashed with an FNV-1a-64 collision
// (and equal x). Build resolves such a pair (HoldNameCollision).
func ServiceName(t MachineType, matID string) string {
	return serviceName("mat-bmc-"+t.nameToken()+"-", matID)
}

// NVOSServiceName returns the name of a switch's NVOS Service, a valid
// DNS-1035 label of at most 38 bytes:
//
//	mat-nvos-<id part>
//
// with the id part of ServiceName (kept short, kept long or hashed, by the
// same rules), e.g. "1a530254-57f0-4a8d-adb9-7d5520153f50" →
// "mat-nvos-1a530254-57f-964ececc". The prefix differs from every BMC
// Service's, so an NVOS name never equals a BMC name, and two NVOS names
// collide exactly when two BMC names of the same token would.
func NVOSServiceName(matID string) string {
	return serviceName("mat-nvos-", matID)
}

// serviceName is prefix + the id part of ServiceName.
func serviceName(prefix, matID string) string {
	if old := prefix + legacyID(matID); isDNS1035Label(old) {
		return old
	}
	id := make([]byte, 0, legacyIDBytes)
	sep := false
	for i := 0; i < len(matID) && len(id) < legacyIDBytes; i++ {
		c := matID[i]
		switch {
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		default:
			sep = true
			continue
		}
		if sep && len(id) > 0 {
			if len(id)+1 >= legacyIDBytes {
				break // a separator would be the last byte kept
			}
			id = append(id, '-')
		}
		sep = false
		id = append(id, c)
	}
	if len(id) == 0 {
		return prefix + hash16(matID)
	}
	return prefix + string(id) + "-" + hash16(matID)
}

// legacyID is the old controller's id part: the mat_id when at most 12
// bytes, else its first 12 bytes (possibly cutting a UTF-8 character) + "-"
// + hash8(mat_id).
func legacyID(matID string) string {
	if len(matID) <= legacyIDBytes {
		return matID
	}
	return matID[:legacyIDBytes] + "-" + hash8(matID)
}

// LabelValue returns a valid label value for s (an instance key, mat_id,
// machine id, pod name or managed-by value), in one of two shapes:
//
//   - kept: s itself, when s is a valid label value (at most 63 bytes;
//     empty, or alphanumeric at both ends with [-_.A-Za-z0-9] between) and
//     does not end in "_" + 16 lower-case hex digits. E.g. a UUID,
//     "mat-ns.mat-bmc-mock", "Rack1_Host.01", a 59-byte machine id.
//   - hashed: x + "_" + hash16(s), 18..63 bytes, for every other s. x keeps
//     as much of s as is readable: every run of bytes outside
//     [-_.A-Za-z0-9] becomes one "-", non-alphanumerics are trimmed from
//     both ends, at most 46 bytes are kept (non-alphanumerics trimmed from
//     the end again); x is "h" when nothing is left. E.g. the 70-byte
//     "mat-switch-rack-0001-…-sn000000000000001" → its first 46 bytes +
//     "_" + 16 hex (63 bytes), "trailing-" → "trailing_<16 hex>",
//     "hôte-ümlaüt-0001" → "h-te-mla-t-0001_<16 hex>", "___" →
//     "h_<16 hex>", and a valid "node_0123456789abcdef" (already of the
//     hashed shape) → "node_<16 hex of it>".
//
// Every hashed value ends in "_" + 16 hex digits and no kept value does, so
// a hashed value never equals a kept one; two distinct inputs share a value
// only when both are hashed, with an FNV-1a-64 collision and the same x.
// LabelValue is stable but not idempotent on hashed values: apply it once,
// to the raw input.
func LabelValue(s string) string {
	if isLabelValue(s) && !hasLabelHash(s) {
		return s
	}
	const keep = maxLabelValue - 1 - hash16Len
	out := make([]byte, 0, maxLabelValue)
	sep := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isLabelByte(c) {
			sep = true
			continue
		}
		if len(out) == 0 && !isAlnum(c) {
			continue // leading non-alphanumerics
		}
		if sep && len(out) > 0 && out[len(out)-1] != '-' && c != '-' {
			out = append(out, '-')
		}
		sep = false
		out = append(out, c)
		if len(out) >= keep {
			break
		}
	}
	if len(out) > keep {
		out = out[:keep]
	}
	for len(out) > 0 && !isAlnum(out[len(out)-1]) {
		out = out[:len(out)-1]
	}
	if len(out) == 0 {
		out = append(out, labelHashFallback...)
	}
	return string(out) + string(labelHashSep) + hash16(s)
}

// hasLabelHash reports whether s ends in "_" + 16 lower-case hex digits,
// the mark of a hashed label value.
func hasLabelHash(s string) bool {
	n := len(s) - hash16Len - 1
	if n < 0 || s[n] != labelHashSep {
		return false
	}
	for i := n + 1; i < len(s); i++ {
		if !isLowerHex(s[i]) {
			return false
		}
	}
	return true
}

// hash8 is FNV-1a-32 over s as 8 lower-case hex digits, the old
// controller's name hash (kept long names only).
func hash8(s string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return fmt.Sprintf("%0*x", hashLen, h.Sum32())
}

// hash16 is FNV-1a-64 over s as 16 lower-case hex digits, the hash of
// hashed names and label values.
func hash16(s string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return fmt.Sprintf("%0*x", hash16Len, h.Sum64())
}

func isLowerHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func isLabelByte(c byte) bool { return isAlnum(c) || c == '-' || c == '_' || c == '.' }

// isLabelValue is validation.IsValidLabelValue without the regexp: at most
// 63 bytes, empty or ^[A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?$.
func isLabelValue(s string) bool {
	if len(s) > maxLabelValue {
		return false
	}
	if s == "" {
		return true
	}
	if !isAlnum(s[0]) || !isAlnum(s[len(s)-1]) {
		return false
	}
	for i := 1; i < len(s)-1; i++ {
		if !isLabelByte(s[i]) {
			return false
		}
	}
	return true
}

// isDNS1035Label is validation.IsDNS1035Label without the regexp: 1..63
// bytes of [a-z0-9-], starting with a letter, ending alphanumeric.
func isDNS1035Label(s string) bool {
	if len(s) == 0 || len(s) > maxLabelValue {
		return false
	}
	if c := s[0]; c < 'a' || c > 'z' {
		return false
	}
	if c := s[len(s)-1]; c == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
