package filestore

import (
	"context"
	"fmt"
)

// MaxIDLen is the longest file id a store accepts.
const MaxIDLen = 200

// ValidateID says whether id may name a file in any store: 1 to MaxIDLen
// bytes of ASCII letters, digits, '-', '_' and '.', not starting with '.'.
// Ids are flat (no '/'), so no id can climb out of a directory store, and
// names starting with '.' stay free for a backend's temporary files. Every
// backend checks ids with it before touching its storage.
func ValidateID(id string) error {
	if id == "" {
		return fmt.Errorf("file id is empty")
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("file id %.20q...: longer than %d bytes", id, MaxIDLen)
	}
	if id[0] == '.' {
		return fmt.Errorf("file id %q: starts with '.'", id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return fmt.Errorf("file id %q: byte %q at %d is not a letter, digit, '-', '_' or '.'", id, c, i)
		}
	}
	return nil
}

// Lister is a Store that can enumerate what it holds; every backend in
// this tree implements it, and the expiry Sweeper needs it.
type Lister interface {
	// List calls fn for every file the store holds, in no set order,
	// until fn returns an error (which List returns). Files put or deleted
	// while List runs may or may not be seen; temporary files are never.
	List(ctx context.Context, fn func(id string, info Info) error) error
}
