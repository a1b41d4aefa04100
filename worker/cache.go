package worker

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/matclient"
)

// StatusClient is what the worker needs of a MAT API client;
// *matclient.Client implements it.
type StatusClient interface {
	Status(ctx context.Context) (*matclient.Status, error)
	Close() error
}

// ClientFactory makes a client for a MAT base URL. It is called only on a
// cache miss.
type ClientFactory func(url string) (StatusClient, error)

// ClientCache keeps one StatusClient per MAT base URL, shared by every
// instance with that URL. A client is created only on a miss and is evicted
// and closed as soon as no instance refers to its URL any more (instance
// gone, URL changed, or every instance gone). Close errors are reported as
// error events of kind "close". It is safe for concurrent use.
type ClientCache struct {
	factory ClientFactory
	report  func(ctx context.Context, e events.Error)

	mu      sync.Mutex
	byURL   map[string]*cacheEntry
	urlOf   map[string]string // instance key -> URL
	created int
	closed  int
}

type cacheEntry struct {
	client StatusClient
	keys   map[string]struct{}
}

// NewClientCache returns an empty cache. report receives Close failures; it may be nil.
func NewClientCache(factory ClientFactory, report func(ctx context.Context, e events.Error)) *ClientCache {
	return &ClientCache{factory: factory, report: report, byURL: map[string]*cacheEntry{}, urlOf: map[string]string{}}
}

// Acquire records that instance key uses url and returns the client for
// url, creating it on a miss. If key used another URL before, that URL is
// released (and its client closed when no other instance uses it).
func (c *ClientCache) Acquire(ctx context.Context, key, url string) (StatusClient, error) {
	c.mu.Lock()
	var toClose []closing
	if old, ok := c.urlOf[key]; ok && old != url {
		toClose = c.releaseLocked(key)
	}
	e, ok := c.byURL[url]
	if !ok {
		cl, err := c.factory(url)
		if err != nil {
			c.mu.Unlock()
			c.closeAll(ctx, toClose)
			return nil, fmt.Errorf("worker: client for %s: %w", url, err)
		}
		c.created++
		e = &cacheEntry{client: cl, keys: map[string]struct{}{}}
		c.byURL[url] = e
	}
	e.keys[key] = struct{}{}
	c.urlOf[key] = url
	cl := e.client
	c.mu.Unlock()
	c.closeAll(ctx, toClose)
	return cl, nil
}

// Release forgets instance key; the client of its URL is closed when no
// other instance uses that URL. Releasing an unknown key does nothing.
func (c *ClientCache) Release(ctx context.Context, key string) {
	c.mu.Lock()
	toClose := c.releaseLocked(key)
	c.mu.Unlock()
	c.closeAll(ctx, toClose)
}

type closing struct {
	url    string
	key    string
	client StatusClient
}

func (c *ClientCache) releaseLocked(key string) []closing {
	url, ok := c.urlOf[key]
	if !ok {
		return nil
	}
	delete(c.urlOf, key)
	e := c.byURL[url]
	if e == nil {
		return nil
	}
	delete(e.keys, key)
	if len(e.keys) > 0 {
		return nil
	}
	delete(c.byURL, url)
	return []closing{{url: url, key: key, client: e.client}}
}

func (c *ClientCache) closeAll(ctx context.Context, cs []closing) {
	for _, x := range cs {
		err := x.client.Close()
		c.mu.Lock()
		c.closed++
		c.mu.Unlock()
		if err != nil && c.report != nil {
			c.report(ctx, events.Error{Kind: events.ErrorClose, Instance: x.key, URL: x.url,
				Message: fmt.Sprintf("close MAT client: %v", err)})
		}
	}
}

// Close closes every cached client (at shutdown) and empties the cache.
func (c *ClientCache) Close(ctx context.Context) {
	c.mu.Lock()
	var cs []closing
	for url, e := range c.byURL {
		cs = append(cs, closing{url: url, client: e.client})
	}
	c.byURL = map[string]*cacheEntry{}
	c.urlOf = map[string]string{}
	c.mu.Unlock()
	c.closeAll(ctx, cs)
}

// CacheStats counts cache activity since start.
type CacheStats struct {
	URLs    []string // cached URLs, sorted
	Created int      // clients made (cache misses)
	Closed  int      // clients closed
}

// Stats returns the current cache statistics.
func (c *ClientCache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := CacheStats{Created: c.created, Closed: c.closed}
	for u := range c.byURL {
		s.URLs = append(s.URLs, u)
	}
	sort.Strings(s.URLs)
	return s
}

// Peek returns the cached client for url without creating one.
func (c *ClientCache) Peek(url string) (StatusClient, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byURL[url]
	if !ok {
		return nil, false
	}
	return e.client, true
}
