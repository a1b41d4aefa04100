package matclient

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrInvalidStatus is wrapped by every error Decode (and so Client.Status)
// returns for a body that is not a valid MAT `GET /machines/status`
// document. Such an error is permanent: fetching the same body again gives
// the same error (IsTransient reports false).
var ErrInvalidStatus = errors.New("matclient: invalid status")

// DecodeError is the concrete error Decode returns for a document that is
// invalid as a whole. It wraps ErrInvalidStatus and, where there is one,
// the underlying encoding/json error (so errors.As with *json.SyntaxError
// works). Status.Validate returns it too, naming a device where one is at
// fault.
type DecodeError struct {
	// Path names the offending element, e.g. "generation" or "machines";
	// "" when the document as a whole is at fault (not JSON, not an object).
	// From Validate it may name a device field, e.g.
	// "machines[0] (mat_id 0c6f3a52-…).bmc.redfish.listen_port".
	Path string
	// Reason says what is wrong with it.
	Reason string
	// Err is the underlying error, if any (nil for validation failures).
	Err error
}

// Error returns "matclient: invalid status: <path>: <reason>".
func (e *DecodeError) Error() string {
	if e.Path == "" {
		return ErrInvalidStatus.Error() + ": " + e.Reason
	}
	return ErrInvalidStatus.Error() + ": " + e.Path + ": " + e.Reason
}

// Unwrap returns ErrInvalidStatus and the underlying error, if any.
func (e *DecodeError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrInvalidStatus, e.Err}
	}
	return []error{ErrInvalidStatus}
}

func invalid(path, format string, args ...any) *DecodeError {
	return &DecodeError{Path: path, Reason: fmt.Sprintf(format, args...)}
}

// Hardware types (MAT's `hardware_type` strings) whose top-level devices are
// not hosts. MAT derives `device_kind` from these; the decoder does the same
// for legacy bodies, which have no `device_kind`.
var kindByHardwareType = map[string]DeviceKind{
	"nvidia_switch_nd5200_ld": KindSwitch,
	"nvidia_switch_n5700_ld":  KindSwitch,
	"liteon_power_shelf":      KindPowerShelf,
	"delta_power_shelf":       KindPowerShelf,
}

// KindForHardwareType returns the kind MAT gives a top-level device of the
// given `hardware_type`: the two NVLink switch models are KindSwitch, the two
// power-shelf models KindPowerShelf, everything else (including "" and
// unknown types) KindMachine. Nested devices are always KindDPU.
func KindForHardwareType(hardwareType string) DeviceKind {
	if k, ok := kindByHardwareType[hardwareType]; ok {
		return k
	}
	return KindMachine
}

// Valid reports whether k is one of the four kinds of the MAT schema.
func (k DeviceKind) Valid() bool {
	switch k {
	case KindMachine, KindDPU, KindSwitch, KindPowerShelf:
		return true
	}
	return false
}

// String returns "legacy", "v2" or "Schema(n)".
func (s Schema) String() string {
	switch s {
	case SchemaLegacy:
		return "legacy"
	case SchemaV2:
		return "v2"
	}
	return "Schema(" + strconv.Itoa(int(s)) + ")"
}

// rawStatus is the top level of the body. Every field is kept raw so that
// presence (schema detection), JSON null and JSON type can be told apart
// and reported with the field's name.
type rawStatus struct {
	InventoryID json.RawMessage `json:"inventory_id"`
	EpochID     json.RawMessage `json:"epoch_id"`
	Generation  json.RawMessage `json:"generation"`
	Machines    json.RawMessage `json:"machines"`
}

type rawDevice struct {
	MatID           json.RawMessage `json:"mat_id"`
	DeviceKind      json.RawMessage `json:"device_kind"`
	DeviceID        json.RawMessage `json:"device_id"`
	MachineID       json.RawMessage `json:"machine_id"`
	HardwareType    json.RawMessage `json:"hardware_type"`
	MatState        json.RawMessage `json:"mat_state"`
	APIState        json.RawMessage `json:"api_state"`
	PowerState      json.RawMessage `json:"power_state"`
	MachineIP       json.RawMessage `json:"machine_ip"`
	NvosIP          json.RawMessage `json:"nvos_ip"`
	InfinibandPorts json.RawMessage `json:"infiniband_ports"`
	BMC             json.RawMessage `json:"bmc"`
	DPUs            json.RawMessage `json:"dpus"`
}

type rawBMC struct {
	IP      json.RawMessage `json:"ip"`
	Redfish json.RawMessage `json:"redfish"`
	IPMI    json.RawMessage `json:"ipmi"`
	SSH     json.RawMessage `json:"ssh"`
}

type rawEndpoint struct {
	ReachablePort json.RawMessage `json:"reachable_port"`
	ListenPort    json.RawMessage `json:"listen_port"`
}

type rawIBPort struct {
	GUID  json.RawMessage `json:"guid"`
	State json.RawMessage `json:"state"`
}

// Decode parses and validates the MAT `GET /machines/status` body, in
// either shape:
//
//   - SchemaV2 (Aug 2026): `inventory_id`, `epoch_id`, `generation` at the
//     top level and `device_kind` on every device;
//   - SchemaLegacy (July 2026): only `machines[]`, no `device_kind`. Nested
//     devices are then KindDPU and top-level ones get KindForHardwareType.
//
// The schema is SchemaV2 when any of `generation`, `inventory_id`,
// `epoch_id` (top level) or a non-null `device_kind` (any device object,
// valid or not) is present. A device without `device_kind` gets its kind
// derived as for legacy bodies. Unknown fields are ignored, so newer MAT
// versions still decode.
//
// Errors about the document as a whole make Decode return a nil Status and
// a *DecodeError wrapping ErrInvalidStatus: invalid JSON, a truncated body
// or data after the document; a top level that is not an object;
// `machines` missing, null or not an array (an empty array is fine);
// `inventory_id` or `epoch_id` that is not a string; `generation` that is
// not an integer in 1..2^64-1.
//
// A device with an invalid field is left out of Status.Machines and listed
// in Status.Invalid instead (see InvalidDevice), and the other devices are
// kept: a device that is not an object, lacks a non-empty string `mat_id`,
// `bmc` or `bmc.redfish`; ports that are not integers in 1..65535; an
// unknown `device_kind`, a top-level DPU, a nested device that is not a
// DPU, or DPUs under a device that is not a host (the parent is invalid);
// `bmc.ip`, `machine_ip` or `nvos_ip` that is not an IPv4 address; an
// InfiniBand port without a `guid`; a string field that is not a string;
// `dpus`, `infiniband_ports` that are not arrays, `bmc` and endpoints that
// are not objects. Every device whose `mat_id` occurs more than once in the
// body is invalid, none is preferred (body order is no stable tie-break).
// The DPUs of an invalid host are invalid too (reason "host machines[i] is
// invalid" unless they have a fault of their own); the DPUs of an invalid
// DPU are not read. Optional fields may be absent or null.
//
// Two devices reporting the same BMC IP are NOT invalid: that is a
// planning decision.
//
// Decode never panics and does not retain body.
func Decode(body []byte) (*Status, error) {
	var top rawStatus
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, jsonError("", "status document", err)
	}
	if t := jsonType(body); t != "object" {
		return nil, invalid("", "top level must be a JSON object, got %s", t)
	}

	st := &Status{Schema: SchemaLegacy}
	var err error
	if present(top.InventoryID) {
		st.Schema = SchemaV2
		if st.InventoryID, err = requireString(top.InventoryID, "inventory_id"); err != nil {
			return nil, err
		}
	}
	if present(top.EpochID) {
		st.Schema = SchemaV2
		if st.EpochID, err = requireString(top.EpochID, "epoch_id"); err != nil {
			return nil, err
		}
	}
	if present(top.Generation) {
		st.Schema = SchemaV2
		if st.Generation, err = parseGeneration(top.Generation); err != nil {
			return nil, err
		}
	}

	switch t := jsonType(top.Machines); t {
	case "missing":
		return nil, invalid("machines", "missing (an instance without devices sends [])")
	case "null":
		return nil, invalid("machines", "is null (an instance without devices sends [])")
	case "array":
	default:
		return nil, invalid("machines", "cannot unmarshal %s into array", t)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(top.Machines, &items); err != nil {
		return nil, jsonError("machines", "array", err)
	}

	var d decoder
	nodes := make([]*node, len(items))
	for i, raw := range items {
		nodes[i] = d.device(raw, "machines["+strconv.Itoa(i)+"]", false)
	}
	if d.sawKind {
		st.Schema = SchemaV2
	}
	markDuplicates(nodes)
	st.Machines = make([]Device, 0, len(nodes))
	for _, n := range nodes {
		if n.err != nil {
			st.Invalid = append(st.Invalid, n.invalid(""))
			for _, c := range n.dpus {
				st.Invalid = append(st.Invalid, c.invalid(n.pos))
			}
			continue
		}
		for _, c := range n.dpus {
			if c.err != nil {
				st.Invalid = append(st.Invalid, c.invalid(""))
				continue
			}
			n.dev.DPUs = append(n.dev.DPUs, c.dev)
		}
		st.Machines = append(st.Machines, n.dev)
	}
	return st, nil
}

// node is one device of the body while Decode tells valid from invalid.
type node struct {
	pos   string       // "machines[3]" or "machines[3].dpus[0]"
	matID string       // "" when missing, empty or not a string
	dev   Device       // the decoded fields (DPUs excluded); meaningful when err is nil
	err   *DecodeError // the device's first fault, Path relative to the device; nil if valid
	dpus  []*node      // the nested devices of a top-level device
}

// invalid returns n as an InvalidDevice. parentPos is the position of
// n's invalid host when n is valid in itself, else "".
func (n *node) invalid(parentPos string) InvalidDevice {
	inv := InvalidDevice{Path: n.pos, MatID: n.matID}
	switch {
	case n.err == nil:
		inv.Reason = "host " + parentPos + " is invalid"
	case n.err.Path == "":
		inv.Reason = n.err.Reason
	default:
		inv.Reason = n.err.Path + ": " + n.err.Reason
	}
	return inv
}

// markDuplicates gives every node whose mat_id occurs more than once (and
// that has no fault of its own) a duplicate-mat_id fault naming the other
// positions.
func markDuplicates(nodes []*node) {
	at := make(map[string][]string, len(nodes))
	var all []*node
	for _, n := range nodes {
		all = append(all, n)
		all = append(all, n.dpus...)
	}
	for _, n := range all {
		if n.matID != "" {
			at[n.matID] = append(at[n.matID], n.pos)
		}
	}
	for _, n := range all {
		pos := at[n.matID]
		if n.err != nil || len(pos) < 2 {
			continue
		}
		others := make([]string, 0, len(pos)-1)
		for _, p := range pos {
			if p != n.pos {
				others = append(others, p)
			}
		}
		n.err = invalid("mat_id", "duplicate mat_id, also at %s", strings.Join(others, ", "))
	}
}

type decoder struct {
	sawKind bool // some device object carried a non-null device_kind
}

// device decodes the device at position pos ("machines[0]" or
// "machines[0].dpus[1]"); nested is true for DPUs. The DPUs of a top-level
// device are decoded even when it is invalid, so that their mat_ids count
// for duplicates and they can be listed; those of a nested device are not.
func (d *decoder) device(raw json.RawMessage, pos string, nested bool) *node {
	n := &node{pos: pos}
	if t := jsonType(raw); t != "object" {
		n.err = invalid("", "device must be a JSON object, got %s", t)
		return n
	}
	var rd rawDevice
	if err := json.Unmarshal(raw, &rd); err != nil {
		n.err = jsonError("", "device object", err)
		return n
	}
	if present(rd.DeviceKind) && jsonType(rd.DeviceKind) != "null" {
		d.sawKind = true
	}
	n.err = asDecodeError(fields(&rd, nested, n))

	switch t := jsonType(rd.DPUs); t {
	case "missing", "null":
		return n
	case "array":
	default:
		if n.err == nil {
			n.err = invalid("dpus", "cannot unmarshal %s into array", t)
		}
		return n
	}
	var items []json.RawMessage
	if err := json.Unmarshal(rd.DPUs, &items); err != nil {
		if n.err == nil {
			n.err = jsonError("dpus", "array", err)
		}
		return n
	}
	if len(items) == 0 {
		return n
	}
	if n.err == nil && n.dev.Kind != KindMachine {
		n.err = invalid("dpus", "a %s cannot have dpus (%d given)", n.dev.Kind, len(items))
	}
	if nested {
		return n
	}
	n.dpus = make([]*node, len(items))
	for i, item := range items {
		n.dpus[i] = d.device(item, pos+".dpus["+strconv.Itoa(i)+"]", true)
	}
	return n
}

// fields decodes every field of one device but its DPUs into n.dev (and
// n.matID) and returns the first fault, a *DecodeError with a Path
// relative to the device.
func fields(rd *rawDevice, nested bool, n *node) error {
	out := &n.dev
	switch t := jsonType(rd.MatID); t {
	case "missing", "null":
		return invalid("mat_id", "missing")
	case "string":
	default:
		return invalid("mat_id", "cannot unmarshal %s into string", t)
	}
	matID, err := requireString(rd.MatID, "mat_id")
	if err != nil {
		return err
	}
	if matID == "" {
		return invalid("mat_id", "empty")
	}
	n.matID = matID
	out.MatID = matID

	strs := []struct {
		raw  json.RawMessage
		name string
		dst  *string
	}{
		{rd.DeviceID, "device_id", &out.DeviceID},
		{rd.MachineID, "machine_id", &out.MachineID},
		{rd.HardwareType, "hardware_type", &out.HardwareType},
		{rd.MatState, "mat_state", &out.MatState},
		{rd.APIState, "api_state", &out.APIState},
		{rd.PowerState, "power_state", &out.PowerState},
	}
	for _, s := range strs {
		if *s.dst, err = optString(s.raw, s.name); err != nil {
			return err
		}
	}
	if out.MachineIP, err = optIPv4(rd.MachineIP, "machine_ip"); err != nil {
		return err
	}
	if out.NvosIP, err = optIPv4(rd.NvosIP, "nvos_ip"); err != nil {
		return err
	}

	// Kind: explicit, or derived the way MAT derives it.
	kindStr, err := optString(rd.DeviceKind, "device_kind")
	if err != nil {
		return err
	}
	switch {
	case present(rd.DeviceKind) && jsonType(rd.DeviceKind) != "null":
		out.Kind = DeviceKind(kindStr)
		if !out.Kind.Valid() {
			return invalid("device_kind", "unknown device kind %q (want machine, dpu, switch or power_shelf)", kindStr)
		}
	case nested:
		out.Kind = KindDPU
	default:
		out.Kind = KindForHardwareType(out.HardwareType)
	}
	if nested && out.Kind != KindDPU {
		return invalid("device_kind", "%q is not valid for a device nested under a host (want dpu)", out.Kind)
	}
	if !nested && out.Kind == KindDPU {
		return invalid("device_kind", "a dpu must be nested under its host, not at the top level")
	}

	if out.InfinibandPorts, err = ibPorts(rd.InfinibandPorts, "infiniband_ports"); err != nil {
		return err
	}
	return bmc(rd.BMC, "bmc", &out.BMC)
}

func bmc(raw json.RawMessage, path string, out *BMC) error {
	switch t := jsonType(raw); t {
	case "missing", "null":
		return invalid(path, "missing (every device has a bmc object)")
	case "object":
	default:
		return invalid(path, "cannot unmarshal %s into object", t)
	}
	var rb rawBMC
	if err := json.Unmarshal(raw, &rb); err != nil {
		return jsonError(path, "object", err)
	}
	var err error
	if out.IP, err = optIPv4(rb.IP, path+".ip"); err != nil {
		return err
	}
	if !present(rb.Redfish) || jsonType(rb.Redfish) == "null" {
		return invalid(path+".redfish", "missing (every bmc has a redfish endpoint)")
	}
	if out.Redfish, err = endpoint(rb.Redfish, path+".redfish"); err != nil {
		return err
	}
	for _, opt := range []struct {
		raw  json.RawMessage
		name string
		dst  **Endpoint
	}{{rb.IPMI, "ipmi", &out.IPMI}, {rb.SSH, "ssh", &out.SSH}} {
		if !present(opt.raw) || jsonType(opt.raw) == "null" {
			continue
		}
		ep, err := endpoint(opt.raw, path+"."+opt.name)
		if err != nil {
			return err
		}
		*opt.dst = &ep
	}
	return nil
}

func endpoint(raw json.RawMessage, path string) (Endpoint, error) {
	if t := jsonType(raw); t != "object" {
		return Endpoint{}, invalid(path, "cannot unmarshal %s into object", t)
	}
	var re rawEndpoint
	if err := json.Unmarshal(raw, &re); err != nil {
		return Endpoint{}, jsonError(path, "object", err)
	}
	var ep Endpoint
	var err error
	if ep.ReachablePort, err = port(re.ReachablePort, path+".reachable_port"); err != nil {
		return Endpoint{}, err
	}
	if ep.ListenPort, err = port(re.ListenPort, path+".listen_port"); err != nil {
		return Endpoint{}, err
	}
	return ep, nil
}

// port parses a TCP/UDP port: a JSON integer in 1..65535.
func port(raw json.RawMessage, path string) (uint16, error) {
	switch t := jsonType(raw); t {
	case "missing", "null":
		return 0, invalid(path, "missing")
	case "number":
	default:
		return 0, invalid(path, "cannot unmarshal %s into uint16", t)
	}
	s := string(raw)
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return 0, invalid(path, "%s is out of range 1..65535", truncate(s, 32))
		}
		return 0, invalid(path, "%s is not an integer port number", truncate(s, 32))
	}
	if n < 1 || n > 65535 {
		return 0, invalid(path, "%d is out of range 1..65535", n)
	}
	return uint16(n), nil
}

func parseGeneration(raw json.RawMessage) (uint64, error) {
	if t := jsonType(raw); t != "number" {
		return 0, invalid("generation", "cannot unmarshal %s into uint64 (generation must be a number)", t)
	}
	s := string(raw)
	g, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, invalid("generation", "%s is not an unsigned 64-bit integer", truncate(s, 32))
	}
	if g == 0 {
		return 0, invalid("generation", "0 is not a generation (MAT starts at 1)")
	}
	return g, nil
}

func ibPorts(raw json.RawMessage, path string) ([]IBPort, error) {
	switch t := jsonType(raw); t {
	case "missing", "null":
		return nil, nil
	case "array":
	default:
		return nil, invalid(path, "cannot unmarshal %s into array", t)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, jsonError(path, "array", err)
	}
	if len(items) == 0 {
		return nil, nil
	}
	out := make([]IBPort, len(items))
	for i, item := range items {
		p := path + "[" + strconv.Itoa(i) + "]"
		if t := jsonType(item); t != "object" {
			return nil, invalid(p, "cannot unmarshal %s into object", t)
		}
		var rp rawIBPort
		if err := json.Unmarshal(item, &rp); err != nil {
			return nil, jsonError(p, "object", err)
		}
		var err error
		if !present(rp.GUID) || jsonType(rp.GUID) == "null" {
			return nil, invalid(p+".guid", "missing")
		}
		if out[i].GUID, err = requireString(rp.GUID, p+".guid"); err != nil {
			return nil, err
		}
		if out[i].GUID == "" {
			return nil, invalid(p+".guid", "empty")
		}
		if out[i].State, err = optString(rp.State, p+".state"); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// optString decodes an optional string: absent or null give "".
func optString(raw json.RawMessage, path string) (string, error) {
	if !present(raw) || jsonType(raw) == "null" {
		return "", nil
	}
	return requireString(raw, path)
}

func requireString(raw json.RawMessage, path string) (string, error) {
	if t := jsonType(raw); t != "string" {
		return "", invalid(path, "cannot unmarshal %s into string", t)
	}
	// Fast path: encoding/json has validated the literal already, so one
	// without escapes and with valid UTF-8 is its own content.
	if len(raw) >= 2 && raw[len(raw)-1] == '"' && bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return string(raw[1 : len(raw)-1]), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", jsonError(path, "string", err)
	}
	return s, nil
}

// optIPv4 decodes an optional IPv4 address in dotted-quad form.
func optIPv4(raw json.RawMessage, path string) (string, error) {
	s, err := optString(raw, path)
	if err != nil || s == "" {
		return "", err
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return "", invalid(path, "%q is not an IPv4 address", truncate(s, 64))
	}
	return a.String(), nil
}

func present(raw json.RawMessage) bool { return len(raw) > 0 }

// jsonType names the JSON type of a raw value that encoding/json already
// found valid: "missing" (absent), "null", "string", "number", "bool",
// "object" or "array".
func jsonType(raw []byte) string {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return "missing"
	}
	switch raw[0] {
	case 'n':
		return "null"
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	case '{':
		return "object"
	case '[':
		return "array"
	}
	return "number"
}

// asDecodeError returns err as a *DecodeError (nil for nil).
func asDecodeError(err error) *DecodeError {
	if err == nil {
		return nil
	}
	var de *DecodeError
	if errors.As(err, &de) {
		return de
	}
	return &DecodeError{Reason: err.Error(), Err: err}
}

// jsonError turns an encoding/json error into a *DecodeError.
func jsonError(path, what string, err error) *DecodeError {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return &DecodeError{Path: path, Reason: fmt.Sprintf("invalid JSON at byte offset %d: %v", se.Offset, se), Err: err}
	case errors.As(err, &te):
		p := path
		if te.Field != "" {
			p = joinPath(path, te.Field)
		}
		return &DecodeError{Path: p, Reason: fmt.Sprintf("cannot unmarshal %s into %s", te.Value, what), Err: err}
	}
	return &DecodeError{Path: path, Reason: err.Error(), Err: err}
}

func joinPath(a, b string) string {
	if a == "" {
		return b
	}
	return a + "." + b
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
