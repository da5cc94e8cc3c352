package redissortedset

import "github.com/sluice-io/sluice/core/transport"

var _ transport.MetricLabeler = (*Transport)(nil)

// MetricLabels labels as upstream's sorted-set loop: the queue's id and
// name, replaced by the envelope's internal.queue_id and request_queue_name
// when it names them (upstream's producer always names the queue).
func (t *Transport) MetricLabels(q transport.Queue) transport.MetricLabels {
	return transport.MetricLabels{QueueID: q.ID, QueueName: q.Name, QueueIDFromMessage: true, QueueNameFromMessage: true}
}
