// Package gatepb is the generated Go code of gate.proto, the protocol between
// sluice and an out-of-process gate plugin. Regenerate it with `make proto`;
// plugin authors use plugins/sdk instead of this package.
package gatepb
