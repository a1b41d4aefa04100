// Package redact owns the one rule by which secrets are kept out of logs,
// error events and error lines: StripUserInfo for the user info of URLs, a
// Redactor for known secret values and bearer tokens, a slog Handler that
// applies it to every record, and FlagSecrets, the secrets a command's flags
// lead to. It never logs, publishes or keeps global state.
package redact
