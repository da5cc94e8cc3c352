package main

import (
	"flag"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/internal/simulator"
)

func newSimulate() *cobra.Command {
	var cfg simulator.Config
	var addr string
	cmd := &cobra.Command{
		Use:   "simulate-gateway",
		Short: "Run an OpenAI-compatible gateway simulator with vLLM-style metrics",
		Long: `Serve /v1/completions and /v1/chat/completions with a configurable latency
and error mix (429 with Retry-After, 5xx, connection resets), and /metrics
with vllm:num_requests_running, vllm:num_requests_waiting and
vllm:kv_cache_usage_perc computed from the real load. Requests may force an
outcome with the headers X-Sim-Status and X-Sim-Latency-Ms.`,
		Example: "  sluice simulate-gateway --addr 127.0.0.1:8000 --latency 200ms --rate-429 0.05",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			srv, err := simulator.New(cfg)
			if err != nil {
				return err
			}
			url, err := srv.Start(addr)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "gateway simulator listening on", url)
			<-cmd.Context().Done()
			return srv.Close()
		},
	}
	gofs := flag.NewFlagSet("simulate-gateway", flag.ContinueOnError)
	cfg.RegisterFlags(gofs)
	cmd.Flags().AddGoFlagSet(gofs)
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8000", "listen address")
	return cmd
}
