package poolsim

// rng is a splitmix64 stream: small, fast and deterministic given its seed.
type rng struct{ state uint64 }

// newRNG returns the stream number n of seed.
func newRNG(seed, n uint64) rng {
	r := rng{state: seed ^ (n * 0x9e3779b97f4a7c15)}
	r.next()
	return r
}

func (r *rng) next() uint64 {
	r.state += 0x9e3779b97f4a7c15
	z := r.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// float64 returns a draw in [0,1).
func (r *rng) float64() float64 { return float64(r.next()>>11) / (1 << 53) }

// intn returns a draw in [0,n); n must be > 0.
func (r *rng) intn(n int) int { return int(r.next() % uint64(n)) }
