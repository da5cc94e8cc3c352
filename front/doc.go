// Package front holds sluice's client-facing HTTP fronts and the file
// stores they keep files in. Nothing under core/ and no adapter imports it;
// a front sits beside the dispatcher and the transports and talks to the
// dispatcher only through a transport's queues.
//
//   - core/submit (not here) is the producer seam every front uses. It puts
//     requests on a request queue and reads their results back from a route
//     of the caller's own (one route per batch, one per synchronous call), so
//     that no front ever demultiplexes a shared result list. Each transport
//     that has a producer implements it in its own package and registers it
//     beside its transport (cmd/sluice/adapters.go).
//   - front/filestore: where the Batch API keeps uploaded input files and
//     the output and error files it writes (local disk by default; an
//     S3-compatible store or GCS by configuration).
//   - front/batch: the OpenAI Batch API (/v1/files, /v1/batches): jobs, their
//     lifecycle and state, built on submit and filestore.
//   - front/openai: the OpenAI-compatible synchronous front
//     (/v1/completions, /v1/chat/completions) on submit.
package front
