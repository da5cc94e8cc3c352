// Package monitoring holds the checks of what sluice ships for monitoring:
// the Grafana dashboards of the Helm chart (deploy/helm/sluice/files/dashboards)
// and the alert rules of its PrometheusRule. It has no code of its own; its
// tests parse every PromQL expression with Prometheus's own parser, check
// that every metric and label they name is one sluice exports (taken from a
// real registry built by core/metrics, so a renamed metric fails them), and
// run promtool over the rendered alert rules.
package monitoring
