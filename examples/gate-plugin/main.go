// Command gate-plugin is an example out-of-process dispatch gate: its budget
// is the number written in a file (so an operator, a cron job or a script can
// open and close the pool with `echo 0.3 > budget`), and it rejects or defers
// requests of listed tenants. Build it with
//
//	go build -o gate-plugin .
//
// and point a queue's gate at it (see README.md).
package main

import "github.com/sluice-io/sluice/plugins/sdk"

func main() { sdk.Serve(&fileGate{}) }
