// Package gatepb is a frozen copy of the code generated from gate.proto at
// protocol version 1 (sluice before the SDK became its own module): the v1
// test plugin is built from it, so that later changes to the proto cannot
// change what this plugin speaks. Do not regenerate.
package gatepb
