//go:build !race

package poolsim

// raceDetector: see race_test.go.
const raceDetector = false
