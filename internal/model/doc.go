// Package model holds executable models of sluice's broker protocols: small,
// deterministic, in-memory state machines that say what the real transports
// must answer to every step and which states they may reach. The
// state-machine tests (pgregory.net/rapid) drive the real code on a real
// redis-server and the model side by side, and compare the two after every
// step (docs/verification.md).
//
// A model knows nothing of Redis, goroutines or clocks: time appears only as
// the steps that make it matter (a lease expires, an entry goes idle).
package model
