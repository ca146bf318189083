//go:build !race

package outboxwatermill_test

// raceDetector reports whether the tests run under the race detector.
const raceDetector = false
