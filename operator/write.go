package operator

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// plural returns n and noun, the noun in the singular for 1 and with an
// s added otherwise: "1 instance", "3 instances".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// WriteJSON writes r as one indented JSON document. Errors: w's.
func WriteJSON(w io.Writer, r *Report) error { return writeJSON(w, r, "plan") }

// writeJSON writes v as one indented JSON document; what names it in the error.
func writeJSON(w io.Writer, v any, what string) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("operator: write %s JSON: %w", what, err)
	}
	return nil
}

// WriteText writes r for a terminal: per instance one line per Service
// action (create, update, recreate, delete, adopt, skip, held) with the
// fields that change, and the deletes a worker holds (why and until
// when), then a summary line, "no change" when nothing would change.
// Errors: w's.
func WriteText(w io.Writer, r *Report) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "namespace %s, --bmc-ip-mode %s: %d Services listed, %s\n", r.Namespace, r.IPMode, r.Services, plural(len(r.Instances), "instance"))
	for _, ip := range r.Instances {
		writeInstanceText(b, ip)
	}
	b.WriteString("\n")
	writeSummaryText(b, r)
	b.WriteString("\n")
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("operator: write plan: %w", err)
	}
	return nil
}

// writeInstanceText writes one instance's part of WriteText: its heading,
// its error, one line per Service action, and its held deletes.
func writeInstanceText(b *strings.Builder, ip InstancePlan) {
	fmt.Fprintf(b, "\ninstance %s (%s", ip.Key, ip.URL)
	if ip.PodName != "" {
		fmt.Fprintf(b, ", pod %s", ip.PodName)
	}
	if ip.Owner != "" {
		fmt.Fprintf(b, ", owner Deployment %s", ip.Owner)
	}
	b.WriteString(")\n")
	if ip.Error != "" {
		fmt.Fprintf(b, "  ERROR     %s\n", ip.Error)
	}
	if ip.Plan == nil {
		return
	}
	for _, c := range ip.Create {
		fmt.Fprintf(b, "  create    %s  %s %s, mat_id %s\n", c.Name, c.MachineType, c.IP, c.MatID)
	}
	for _, c := range ip.Update {
		note := ""
		if c.Adopt {
			note = "  (adopts the old controller's Service)"
		}
		fmt.Fprintf(b, "  update    %s%s\n", c.Name, note)
		writeFields(b, c.Fields)
	}
	for _, c := range ip.Recreate {
		fmt.Fprintf(b, "  recreate  %s  %s\n", c.Name, c.Reason)
		writeFields(b, c.Fields)
	}
	for _, d := range ip.Delete {
		fmt.Fprintf(b, "  delete    %s  mat_id %s\n", d.Name, d.MatID)
	}
	for _, c := range ip.Adopt {
		fmt.Fprintf(b, "  adopt     %s  %s\n", c.Name, additionsText(c.Fields))
	}
	for _, s := range ip.Skipped {
		fmt.Fprintf(b, "  skip      %s  %s\n", s.Name, s.Reason)
	}
	writeHoldText(b, ip)
	if ip.Changes() == 0 && ip.Error == "" {
		fmt.Fprintf(b, "  no change (%d adoptions)\n", len(ip.Adopt))
	}
}

// writeHoldText writes the deletes a worker holds (why and until when) and
// the devices held back from a Service.
func writeHoldText(b *strings.Builder, ip InstancePlan) {
	if dh := ip.DeleteHold; dh != nil {
		switch {
		case !dh.Until.IsZero():
			fmt.Fprintf(b, "  deletes held until %s (%s: %s); they run only if a status fetched then still lacks the devices:\n",
				dh.Until.UTC().Format(time.RFC3339), dh.Reason, dh.Detail)
		default:
			fmt.Fprintf(b, "  deletes a worker would hold for %s (%s: %s); they run only if a status fetched then still lacks the devices:\n",
				dh.Window, dh.Reason, dh.Detail)
		}
		if dh.Unknown != "" {
			fmt.Fprintf(b, "  (%s)\n", dh.Unknown)
		}
		for _, d := range ip.HeldDeletes {
			fmt.Fprintf(b, "  hold      %s  mat_id %s\n", d.Name, d.MatID)
		}
	}
	for _, h := range ip.Held {
		name := h.Name
		if name == "" {
			name = "(no name)"
		}
		fmt.Fprintf(b, "  held      %s  mat_id %s: %s", name, h.MatID, h.Reason)
		if h.Detail != "" {
			fmt.Fprintf(b, " (%s)", h.Detail)
		}
		b.WriteString("\n")
	}
}

// writeSummaryText writes WriteText's summary line (without its newline):
// the changes by kind, or "no change"; the instances not planned; the
// deletes held.
func writeSummaryText(b *strings.Builder, r *Report) {
	creates, updates, recreates, deletes := 0, 0, 0, 0
	for _, ip := range r.Instances {
		creates += len(ip.Create)
		updates += len(ip.Update)
		recreates += len(ip.Recreate)
		deletes += len(ip.Delete)
	}
	switch {
	case r.Changes == 0 && r.Errors > 0:
		fmt.Fprintf(b, "no change in the instances planned (%d adoptions that only add matbus's labels and annotation)", r.Adoptions)
	case r.Changes == 0:
		fmt.Fprintf(b, "no change (%d adoptions that only add matbus's labels and annotation)", r.Adoptions)
	default:
		fmt.Fprintf(b, "%d changes: %d creates, %d updates, %d recreates, %d deletes; %d adoptions that only add matbus's labels and annotation",
			r.Changes, creates, updates, recreates, deletes, r.Adoptions)
	}
	if r.Errors > 0 {
		fmt.Fprintf(b, "; %s could not be planned (what they would change is unknown):", plural(r.Errors, "instance"))
		for _, ip := range r.Instances {
			if ip.Error != "" {
				fmt.Fprintf(b, "\n  %s: %s", ip.Key, ip.Error)
			}
		}
	}
	held := 0
	for _, ip := range r.Instances {
		held += len(ip.HeldDeletes)
	}
	if held > 0 {
		fmt.Fprintf(b, "; %d deletes held (not changes: many devices vanished at once)", held)
	}
}

// writeFields writes one line per field change:
// "+ label k=v", "~ annotation k: old -> new", "- port ssh (TCP 22->2222)".
func writeFields(b *strings.Builder, fs []FieldChange) {
	for _, f := range fs {
		what := f.Field
		if f.Key != "" {
			what += " " + f.Key
		}
		switch f.Op {
		case "add":
			fmt.Fprintf(b, "              + %s: %q\n", what, f.New)
		case "remove":
			fmt.Fprintf(b, "              - %s (was %q)\n", what, f.Old)
		default:
			fmt.Fprintf(b, "              ~ %s: %q -> %q\n", what, f.Old, f.New)
		}
	}
}

// additionsText is "+k=v, +k2=v2" of an adoption's field changes.
func additionsText(fs []FieldChange) string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = "+" + f.Key + "=" + f.New
	}
	return strings.Join(s, ", ")
}
