package cowmap

import (
	"sync"
	"testing"
)

// Store keeps the first value for a key, stops at Max, and concurrent
// loads and stores see a consistent map.
func TestMap(t *testing.T) {
	m := Map[string, int]{Max: 2}
	if _, ok := m.Load("a"); ok {
		t.Fatal("empty map has a")
	}
	if v := m.Store("a", 1); v != 1 {
		t.Fatalf("Store(a, 1) = %d", v)
	}
	if v := m.Store("a", 2); v != 1 {
		t.Fatalf("second Store(a) = %d, want the first value", v)
	}
	m.Store("b", 2)
	if v := m.Store("c", 3); v != 3 {
		t.Fatalf("Store past Max = %d, want the value given", v)
	}
	if _, ok := m.Load("c"); ok || m.Len() != 2 {
		t.Fatalf("map grew past Max: %d keys", m.Len())
	}
	var wg sync.WaitGroup
	big := Map[int, int]{Max: 100}
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				k := (g*200 + i) % 150
				if v := big.Store(k, k); v != k {
					t.Errorf("Store(%d) = %d", k, v)
				}
				if v, ok := big.Load(k); ok && v != k {
					t.Errorf("Load(%d) = %d", k, v)
				}
			}
		})
	}
	wg.Wait()
	if big.Len() != 100 {
		t.Fatalf("%d keys, want 100", big.Len())
	}
}
