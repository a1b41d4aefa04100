package worker

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"
)

func TestServiceRangesListAgainWhenOutside(t *testing.T) {
	a, b := netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("10.200.0.0/22")
	answers := []struct {
		p   []netip.Prefix
		err error
	}{{[]netip.Prefix{a}, nil}, {nil, errors.New("forbidden")}, {[]netip.Prefix{a, b}, nil}}
	lists := 0
	r := &ServiceRanges{
		list: func(context.Context) ([]netip.Prefix, error) {
			ans := answers[min(lists, len(answers)-1)]
			lists++
			return ans.p, ans.err
		},
		relist: time.Hour,
		log:    slog.New(slog.DiscardHandler),
	}
	ctx := context.Background()
	r.refresh(ctx)
	inB := netip.MustParseAddr("10.200.0.7")
	// Inside the known ranges: no list. Outside, but listed less than
	// relist ago: no list either.
	if got := r.For(ctx, netip.MustParseAddr("10.96.1.1")); !slices.Equal(got, []netip.Prefix{a}) || lists != 1 {
		t.Fatalf("For(inside) = %v after %d lists", got, lists)
	}
	if got := r.For(ctx, inB); !slices.Equal(got, []netip.Prefix{a}) || lists != 1 {
		t.Fatalf("For(outside) within relist = %v after %d lists", got, lists)
	}
	// Due: a failed list keeps the last good ranges.
	r.relist = 0
	if got := r.For(ctx, inB); !slices.Equal(got, []netip.Prefix{a}) || lists != 2 {
		t.Fatalf("For after a failed list = %v after %d lists", got, lists)
	}
	// The next list knows the ServiceCIDR created since.
	if got := r.For(ctx, inB); !slices.Equal(got, []netip.Prefix{a, b}) || lists != 3 {
		t.Fatalf("For after a good list = %v after %d lists", got, lists)
	}
	c := Classifier{Ranges: r}
	if c.OutsideRange(ctx, "10.200.0.9") || !c.OutsideRange(ctx, "192.0.2.1") {
		t.Errorf("OutsideRange with %v wrong", c.Prefixes())
	}
}
