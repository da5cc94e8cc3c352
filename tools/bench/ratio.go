package main

import (
	"context"
	"math"
	"slices"
)

// The one ratio definition of the bench: a scenario that compares sluice
// with a baseline measures both in every run, the order alternating (sluice
// first on odd runs, the 1st, 3rd, ...; the baseline first on even runs), and
// its ratio is the median over the runs of each run's own ratio, sluice's
// figure over the baseline's beside it. A ratio of medians, or runs that
// always start with the same side, are not used anywhere.

// side is one setup a scenario measures in each run; run counts from 0.
type side func(ctx context.Context, run int) error

// alternate runs every side once per run, runs times: on odd runs (1st,
// 3rd, ...) in the order given, on even runs in the reverse order. List
// sluice's setups first and the baseline last, so that sluice goes first on
// odd runs and the baseline first on even ones. It stops at the first error.
func alternate(ctx context.Context, runs int, sides ...side) error {
	for run := range runs {
		order := slices.Clone(sides)
		if run%2 == 1 {
			slices.Reverse(order)
		}
		for _, s := range order {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := s(ctx, run); err != nil {
				return err
			}
		}
	}
	return nil
}

// medianRatio is the median over the runs of num[i] / den[i], each run
// against the baseline run beside it. It is NaN when the two do not pair up
// (a scenario bug: a NaN ratio misses every target).
func medianRatio(num, den []float64) float64 {
	if len(num) != len(den) || len(num) == 0 {
		return math.NaN()
	}
	rs := make([]float64, len(num))
	for i := range num {
		rs[i] = num[i] / den[i]
	}
	return median(rs)
}
