package faulttest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/events"
)

// natsCluster is a JetStream cluster of nats-server processes routed to
// each other on loopback, each with its own file store and monitoring port.
type natsCluster struct {
	t     *testing.T
	nodes []*natsProc
}

// startNATSCluster starts n nodes named n1…nN in dir/<name> and waits
// until each answers JetStream requests (the cluster has a meta leader).
func startNATSCluster(t *testing.T, dir string, n int, auth natsAuth) *natsCluster {
	t.Helper()
	c := &natsCluster{t: t}
	routePorts := make([]int, n)
	var routes []string
	for i := range n {
		routePorts[i] = freePort(t)
		routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(routePorts[i]))
	}
	for i := range n {
		name := fmt.Sprintf("n%d", i+1)
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, &natsProc{t: t, dir: d, store: filepath.Join(d, "jetstream"), port: freePort(t),
			server: name, monitor: freePort(t), auth: auth, extra: []string{"--cluster_name", "faulttest",
				"--cluster", "nats://127.0.0.1:" + strconv.Itoa(routePorts[i]), "--routes", strings.Join(routes, ",")}})
	}
	for _, node := range c.nodes {
		node.launch()
	}
	for _, node := range c.nodes {
		node.waitJetStream(2 * time.Minute)
	}
	return c
}

// URL is the client URL list, comma separated (what --nats-url takes).
func (c *natsCluster) URL() string {
	var urls []string
	for _, n := range c.nodes {
		urls = append(urls, n.URL())
	}
	return strings.Join(urls, ",")
}

// node returns the node of server name (e.g. "n2").
func (c *natsCluster) node(name string) *natsProc {
	c.t.Helper()
	for _, n := range c.nodes {
		if n.server == name {
			return n
		}
	}
	c.t.Fatalf("no node %q", name)
	return nil
}

// metaLeader returns the meta leader as the running nodes' /jsz report it
// ("" while they know none).
func (c *natsCluster) metaLeader() string {
	for _, n := range c.nodes {
		if n.p.Exited() {
			continue
		}
		var jsz struct {
			Meta *struct {
				Leader string `json:"leader"`
			} `json:"meta_cluster"`
		}
		cl := &http.Client{Timeout: 2 * time.Second}
		resp, err := cl.Get("http://127.0.0.1:" + strconv.Itoa(n.monitor) + "/jsz")
		if err != nil {
			continue
		}
		err = json.NewDecoder(resp.Body).Decode(&jsz)
		resp.Body.Close()
		cl.CloseIdleConnections()
		if err == nil && jsz.Meta != nil && jsz.Meta.Leader != "" {
			return jsz.Meta.Leader
		}
	}
	return ""
}

func (c *natsCluster) stop() {
	for _, n := range c.nodes {
		n.stop()
	}
}

// streamCluster returns the leader and the replicas of stream (by role,
// e.g. "DELETE") as its leader reports them.
func (w *world) streamCluster(role string) (*jetstream.ClusterInfo, error) {
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	s, err := w.js.Stream(ctx, w.bus.StreamName(events.Role(role)))
	if err != nil {
		return nil, err
	}
	info := s.CachedInfo()
	if info.Cluster == nil {
		return nil, fmt.Errorf("stream %s: no cluster information", role)
	}
	return info.Cluster, nil
}

// allCurrent reports whether every stream and job consumer of the world
// has replicas peers, all current, and a leader; desc says what is missing.
func (w *world) allCurrent() (bool, string) {
	for _, role := range []string{"INSTANCES", "SYNC", "DELETE", "ERRORS"} {
		ci, err := w.streamCluster(role)
		if err != nil {
			return false, err.Error()
		}
		if ci.Leader == "" || len(ci.Replicas) != w.replicas-1 {
			return false, fmt.Sprintf("%s: leader %q, %d followers", role, ci.Leader, len(ci.Replicas))
		}
		for _, r := range ci.Replicas {
			if !r.Current || r.Offline {
				return false, fmt.Sprintf("%s: follower %s current=%v offline=%v lag=%d", role, r.Name, r.Current, r.Offline, r.Lag)
			}
		}
	}
	for _, c := range [][2]string{{"SYNC", events.SyncConsumer}, {"DELETE", events.DeleteConsumer}} {
		ci, err := w.consumerInfo(c[0], c[1])
		if err != nil {
			return false, err.Error()
		}
		if ci.Cluster == nil || ci.Cluster.Leader == "" || len(ci.Cluster.Replicas) != w.replicas-1 {
			return false, fmt.Sprintf("consumer %s: %+v", c[1], ci.Cluster)
		}
		for _, r := range ci.Cluster.Replicas {
			if !r.Current || r.Offline {
				return false, fmt.Sprintf("consumer %s: follower %s current=%v offline=%v", c[1], r.Name, r.Current, r.Offline)
			}
		}
	}
	return true, ""
}

// stepDown asks JetStream for a new leader of a stream (consumer == "")
// or of one of its consumers; preferred names the server to lead next
// ("" for any). It returns the API's error, if any.
func (w *world) stepDown(role, consumer, preferred string) error {
	subj := "$JS.API.STREAM.LEADER.STEPDOWN." + w.bus.StreamName(events.Role(role))
	if consumer != "" {
		subj = "$JS.API.CONSUMER.LEADER.STEPDOWN." + w.bus.StreamName(events.Role(role)) + "." + consumer
	}
	var body []byte
	if preferred != "" {
		body = []byte(`{"placement":{"preferred":"` + preferred + `"}}`)
	}
	m, err := w.nc.Request(subj, body, 10*time.Second)
	if err != nil {
		return fmt.Errorf("%s: %w", subj, err)
	}
	var resp struct {
		Success bool `json:"success"`
		Error   *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return fmt.Errorf("%s: %w", subj, err)
	}
	if !resp.Success {
		if resp.Error != nil {
			return fmt.Errorf("%s: %s", subj, resp.Error.Description)
		}
		return fmt.Errorf("%s: no success", subj)
	}
	return nil
}

// consumerLeader returns the leader of a job consumer ("" when unknown).
func (w *world) consumerLeader(role, consumer string) string {
	ci, err := w.consumerInfo(role, consumer)
	if err != nil || ci.Cluster == nil {
		return ""
	}
	return ci.Cluster.Leader
}
