// Package natsconn connects a matbus process to NATS: reconnecting
// forever, logging refused credentials at most every 30 s, and reading the
// credentials and TLS files again at each connect and reconnect (a
// missing or half-written file keeps the last good contents). For the
// one-shot commands, ConnectReachable waits a bounded time and says why
// no connection was made (connection refused, no such host, TLS or
// credentials). It never logs a credential or the user info of a URL.
package natsconn
