package main

import "testing"

func TestAutoSimulators(t *testing.T) {
	for n, want := range map[int]int{3: 3, 200: 5, 2000: 5, 2500: 5, 2501: 6, 10000: 20, 20000: 40} {
		if got := autoSimulators(n); got != want {
			t.Errorf("autoSimulators(%d) = %d, want %d", n, got, want)
		}
	}
}
