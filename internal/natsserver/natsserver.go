// Package natsserver runs an embedded NATS server with JetStream in this
// process (github.com/nats-io/nats-server/v2), for `matbus dev` and tests.
package natsserver

import (
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options configures an embedded server.
type Options struct {
	// Host and Port to listen on; Port 0 picks a free port, -1 likewise
	// (nats-server's RANDOM_PORT). Default host 127.0.0.1.
	Host string
	Port int
	// StoreDir holds the JetStream file store; "" means a temporary folder
	// removed by Shutdown.
	StoreDir string
}

// Server is a running embedded server.
type Server struct {
	*server.Server
	tmp string
}

// Start starts the server with JetStream and waits up to 10 s for it to
// accept connections.
func Start(o Options) (*Server, error) {
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.Port == 0 {
		o.Port = server.RANDOM_PORT
	}
	s := &Server{}
	if o.StoreDir == "" {
		d, err := os.MkdirTemp("", "matbus-nats-")
		if err != nil {
			return nil, fmt.Errorf("natsserver: %w", err)
		}
		o.StoreDir, s.tmp = d, d
	}
	ns, err := server.NewServer(&server.Options{
		Host: o.Host, Port: o.Port, JetStream: true, StoreDir: o.StoreDir,
		NoSigs: true, NoLog: true, ServerName: "matbus-embedded",
	})
	if err != nil {
		s.cleanup()
		return nil, fmt.Errorf("natsserver: %w", err)
	}
	s.Server = ns
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		s.cleanup()
		return nil, fmt.Errorf("natsserver: not ready after 10s on %s:%d", o.Host, o.Port)
	}
	return s, nil
}

// Shutdown stops the server and removes a temporary store.
func (s *Server) Shutdown() {
	s.Server.Shutdown()
	s.Server.WaitForShutdown()
	s.cleanup()
}

func (s *Server) cleanup() {
	if s.tmp != "" {
		os.RemoveAll(s.tmp)
	}
}
