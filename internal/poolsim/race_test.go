//go:build race

package poolsim

// raceDetector reports whether the tests run under the race detector, where
// the calibration replays of the 1,024-seat pool take minutes: make test runs
// them again without it (TestPresetLoadShare).
const raceDetector = true
