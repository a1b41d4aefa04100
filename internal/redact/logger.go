package redact

import (
	"fmt"
	"io"
	"log/slog"
)

// NewLogger returns a logger writing to w at level ("debug", "info",
// "warn" or "error") in format ("text" or "json") whose every line passes
// through a Handler: secrets, the user info of URLs and bearer tokens
// never reach w. The error names the flag of a bad level or format
// (--log-level, --log-format).
func NewLogger(w io.Writer, level, format string, secrets []string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	hopts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	switch format {
	case "text":
		h = slog.NewTextHandler(w, hopts)
	case "json":
		h = slog.NewJSONHandler(w, hopts)
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
	return slog.New(NewHandler(h, New(secrets))), nil
}
