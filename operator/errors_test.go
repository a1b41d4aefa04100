package operator

import (
	"bytes"
	"testing"
	"time"

	"github.com/matbus/matbus/events"
)

// TestWriteErrorEventText: the text line of an error event names its kind,
// target and the process that saw the failure (from=, whether a worker or
// a discovery publisher); the JSON form is the event as published.
func TestWriteErrorEventText(t *testing.T) {
	at := time.Date(2026, 12, 6, 5, 53, 52, 0, time.UTC)
	body, err := events.Encode(events.TypeError, "id-1", "dev-discovery", at, events.Error{
		Kind: events.ErrorFetch, Instance: "matbus-dev.mat-1", Worker: "dev-discovery", Attempts: 3,
		Message: "instance taken out of rotation",
	})
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	WriteErrorEvent(&text, "mat.errors.fetch", body, false)
	want := "2026-12-06T05:53:52Z fetch     instance=matbus-dev.mat-1 from=dev-discovery attempts=3: instance taken out of rotation\n"
	if text.String() != want {
		t.Errorf("text:\n got %q\nwant %q", text.String(), want)
	}
	var js bytes.Buffer
	WriteErrorEvent(&js, "mat.errors.fetch", body, true)
	if got := js.String(); got != string(bytes.TrimSpace(body))+"\n" {
		t.Errorf("json: got %q, want the body %q", got, body)
	}
}
