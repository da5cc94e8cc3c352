package names

import (
	"slices"
	"testing"
)

func TestSetAndUnknown(t *testing.T) {
	got := Set(" a, b,,a ,")
	if len(got) != 2 || !got["a"] || !got["b"] {
		t.Fatalf("Set = %v, want {a b}", got)
	}
	if len(Set("")) != 0 {
		t.Fatal("an empty list is not an empty set")
	}
	if u := Unknown(Set("c,a,zz"), []string{"a", "b"}); !slices.Equal(u, []string{"c", "zz"}) {
		t.Fatalf("Unknown = %v, want [c zz]", u)
	}
}
