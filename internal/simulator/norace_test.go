//go:build !race

package simulator

// raceEnabled is true under -race, where sync.Pool drops items at random and
// allocation counts mean nothing.
const raceEnabled = false
