// Package deploy holds what runs sluice in a cluster: the Helm chart
// (helm/sluice) and its tests.
//
// The tests render the chart with a pinned helm (built once from
// helm.sh/helm/v3 at helmVersion and kept in the user's cache directory),
// check what upstream's own chart tests pin down plus sluice's keys, and
// start the built sluice binary with the arguments, environment and files
// the chart renders for every values file in helm/sluice/ci, against a real
// redis-server, Prometheus and Pub/Sub emulator.
package deploy
