package plan

import (
	"github.com/matbus/matbus/matclient"
)

// MachineType is the kind of device a Service fronts, as written in
// LabelMachineType.
type MachineType string

// Machine types, from matclient.DeviceKind machine, dpu, switch and
// power_shelf.
const (
	MachineTypeHost       MachineType = "host"
	MachineTypeDPU        MachineType = "dpu"
	MachineTypeSwitch     MachineType = "switch"
	MachineTypePowerShelf MachineType = "power-shelf"
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
	// hashLen is the length of hash8's output.
	hashLen = 8
)

// ServiceName returns the Service name of a device:
//
//	mat-bmc-<host|dpu>-<id>
//
// The type token is "dpu" for DPUs and "host" for everything else (hosts,
// switches, power shelves), as the old controller named them. <id> is, by
// the old controller's rule, the mat_id itself when it is at most 12 bytes,
// else its first 12 bytes + "-" + hash8(mat_id), e.g.
// "922f3d9b-20be-461f-9b69-90928701ce93" (DPU) → "mat-bmc-dpu-922f3d9b-20b-4da64654".
//
// When that old name is a valid DNS-1035 label it is returned unchanged, so
// an old install is adopted without churn. Otherwise (upper case, `_`, `.`,
// a trailing `-`, non-ASCII, …) the id is lower-cased, every run of bytes
// outside [a-z0-9] becomes one "-", leading and trailing "-" are trimmed,
// at most 12 bytes are kept (trailing "-" trimmed again) and "-" +
// hash8(original mat_id) is appended, e.g. "Node_7" → "mat-bmc-host-node-7-<hash>",
// "3F2B6C1E-8A4D-…" → "mat-bmc-host-3f2b6c1e-8a4-14efda34". The hash is
// always over the original id, so ids that sanitise alike stay distinct. The
// result is always a valid DNS-1035 label of at most 34 bytes. Distinct ids
// collide only on a 32-bit FNV collision; Build resolves that (HoldNameCollision).
func ServiceName(t MachineType, matID string) string {
	prefix := "mat-bmc-" + t.nameToken() + "-"
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
		return prefix + hash8(matID)
	}
	return prefix + string(id) + "-" + hash8(matID)
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

// LabelValue returns s when it is a valid label value (at most 63 bytes;
// empty, or alphanumeric at both ends with [-_.A-Za-z0-9] between).
// Otherwise it returns a valid value that keeps as much of s as is
// readable, plus a stable hash: every run of bytes outside [-_.A-Za-z0-9]
// becomes one "-", non-alphanumerics are trimmed from both ends, at most 54
// bytes are kept (non-alphanumerics trimmed from the end again) and "-" +
// hash8(s) is appended (just hash8(s) when nothing is left). E.g. the
// 70-byte "mat-switch-rack-0001-…-sn000000000000001" → its first 54 bytes +
// "-11524c59" (63 bytes), "trailing-" → "trailing-<hash>", "hôte-ümlaüt-0001"
// → "h-te-mla-t-0001-<hash>". Valid values are never hashed, so a hashed
// value equals a valid one only on a 32-bit FNV collision.
func LabelValue(s string) string {
	if isLabelValue(s) {
		return s
	}
	const keep = maxLabelValue - 1 - hashLen
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
		return hash8(s)
	}
	return string(out) + "-" + hash8(s)
}

// hash8 is FNV-1a-32 over s as 8 lower-case hex digits, the old
// controller's name hash.
func hash8(s string) string {
	const (
		offset32 = 2166136261
		prime32  = 16777619
		hexDigit = "0123456789abcdef"
	)
	h := uint32(offset32)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= prime32
	}
	var b [hashLen]byte
	for i := hashLen - 1; i >= 0; i-- {
		b[i] = hexDigit[h&0xf]
		h >>= 4
	}
	return string(b[:])
}

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
