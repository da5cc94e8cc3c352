// Command sluice is the dispatch agent for LLM batch traffic: it pulls
// requests from a queue, lets each through when its dispatch gate has room,
// POSTs it to the inference gateway with its deadline, and writes one result
// per request.
//
// Subcommands:
//
//	serve             run the dispatcher
//	demo              the embedded demo (memory queue, gateway simulator, constant gate)
//	simulate-gateway  an OpenAI-compatible gateway simulator
//	simulate-pool     a simulated inference pool: vLLM-like engines behind an EPP-like front
//	validate          check a configuration, printing every problem
//	version           print the version
//	enqueue           enqueue requests into a Redis sorted-set queue
//	results           print results from a Redis result list
//	cancel            cancel a job or one request
//	queues            show request queues and their depths
//	migrate           move sorted-set queue state to or from upstream's layout
//	plugin            describe a gate plugin binary, or run the gate conformance suite against it
//	batch             submit, watch, cancel and download OpenAI batches; batch demo runs one embedded
//
// Run with no subcommand, as upstream's Helm chart runs llm-d-async
// (`/llm-d-async <flags>`), it is the dispatcher with upstream's flags and
// defaults: a first argument starting with "-" (other than -h and --help),
// or no argument at all, means serve as upstream's binary would.
//
// The transports and gates it links are chosen in one file, adapters.go.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/core/redact"
)

// Set by the linker: -ldflags "-X main.version=..."
var (
	version = "dev"
	commit  = ""
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	setRedisLogger(nil) // go-redis's own log lines, redacted; serve sets its configured logger
	root, args := newCLI(os.Args[1:])
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "sluice:", redact.Error(err)) // every subcommand: no URL password on stderr
		if len(os.Args) == 1 {
			fmt.Fprintln(os.Stderr, "sluice: run with no arguments, sluice starts as upstream's llm-d-async does; \"sluice help\" lists the subcommands")
		}
		os.Exit(1)
	}
}

// exitError ends the process with a code, its message already printed.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// newCLI returns the command to execute for the command-line arguments
// args: the root with its subcommands, or, when args name no subcommand
// (none at all, or the first starts with "-" and is not -h or --help), the
// dispatcher as upstream's binary runs.
func newCLI(args []string) (*cobra.Command, []string) {
	if len(args) == 0 || (strings.HasPrefix(args[0], "-") && args[0] != "-h" && args[0] != "--help") {
		return newUpstream(), args
	}
	return newRoot(), args
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "sluice",
		Short: "Dispatch agent for LLM batch traffic",
		Long: `sluice sits between a request queue and an inference gateway. It takes
requests in deadline order, lets each through only while its dispatch gate
says the pool has room, POSTs it to the gateway with its deadline, and
writes exactly one result per request. Retryable failures come back after
exponential backoff; everything else ends as an error result.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newServe(), newDemo(), newSimulate(), newSimulatePool(), newValidate(), newVersion())
	root.AddCommand(redisCommands()...)
	root.AddCommand(newMigrate())
	root.AddCommand(newPlugin())
	root.AddCommand(newBatchCmd())
	return root
}

func newVersion() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			v := version
			if commit != "" {
				v += " (" + commit + ")"
			}
			fmt.Fprintln(cmd.OutOrStdout(), "sluice", v)
		},
	}
}
