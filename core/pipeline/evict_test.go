package pipeline

import "testing"

// A queue whose evict or evict_limit changed is a changed queue: a reload
// replaces it (Reconfigure keeps only queues whose spec is equal).
func TestQueueSpecEvict(t *testing.T) {
	base := Queue{}
	base.Name = "q"
	for _, tc := range []struct {
		name string
		edit func(*Queue)
	}{
		{"evict", func(q *Queue) { q.Evict = true }},
		{"evict_limit", func(q *Queue) { q.EvictLimit = 5 }},
	} {
		changed := base
		tc.edit(&changed)
		if specOf(base).equal(specOf(changed)) {
			t.Errorf("%s changed, yet the specs compare equal", tc.name)
		}
		if !specOf(changed).equal(specOf(changed)) {
			t.Errorf("%s: a spec differs from itself", tc.name)
		}
	}
}
