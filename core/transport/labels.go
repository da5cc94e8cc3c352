package transport

// MetricLabels says how a transport's queue fills upstream's queue_id and
// queue_name metric labels, which upstream fills differently per transport:
// redis-sortedset labels with the queue id and name, either replaced by the
// envelope's own internal.queue_id and request_queue_name; redis-pubsub with
// queue_id "" (or the envelope's) and the channel; gcp-pubsub with
// queue_id "" and the subscription.
type MetricLabels struct {
	QueueID, QueueName string
	// QueueIDFromMessage: a request's internal.queue_id, when set, replaces QueueID.
	QueueIDFromMessage bool
	// QueueNameFromMessage: a request's request_queue_name, when set, replaces QueueName.
	QueueNameFromMessage bool
}

// MetricLabeler is implemented by transports that label their queues
// otherwise than the default of MetricLabelsOf.
type MetricLabeler interface {
	MetricLabels(q Queue) MetricLabels
}

// MetricLabelsOf returns how t labels queue q: what t says, else queue_id =
// q.ID and queue_name = q.Name with no per-message replacement.
func MetricLabelsOf(t Transport, q Queue) MetricLabels {
	if l, ok := t.(MetricLabeler); ok {
		return l.MetricLabels(q)
	}
	return MetricLabels{QueueID: q.ID, QueueName: q.Name}
}
