package main

import (
	"testing"

	"github.com/sluice-io/sluice/core/pipeline"
)

// The order check counts a grant as a violation only when a request of a
// strictly lower lane had been waiting longer, and as strict when any
// request of a lower lane waited; it refuses logs no lanes could write.
func TestCheckOrder(t *testing.T) {
	const (
		wait    = pipeline.LaneWaiting
		grant   = pipeline.LaneGranted
		abandon = pipeline.LaneAbandoned
	)
	tests := []struct {
		name               string
		steps              []laneStep
		violations, strict int
		wantErr            bool
	}{
		{"in order", []laneStep{
			{wait, 5, 1}, {wait, 0, 2}, {wait, 3, 3},
			{grant, 0, 2}, {grant, 3, 3}, {grant, 5, 1}, {grant, 1, 4},
		}, 0, 0, false},
		{"an older lower-lane request passed over", []laneStep{
			{wait, 0, 1}, {wait, 5, 2}, {grant, 5, 2}, {grant, 0, 1},
		}, 1, 1, false},
		{"a newcomer takes a worker while a lower lane waits", []laneStep{
			{wait, 2, 1}, {grant, 4, 2}, {grant, 2, 1},
		}, 1, 1, false},
		{"a younger lower-lane request passed over: strict only", []laneStep{
			{wait, 4, 1}, {wait, 1, 2}, {grant, 4, 1}, {grant, 1, 2},
		}, 0, 1, false},
		{"an abandoned waiter no longer counts", []laneStep{
			{wait, 0, 1}, {wait, 5, 2}, {abandon, 0, 1}, {grant, 5, 2},
		}, 0, 0, false},
		{"same lane is not a violation", []laneStep{
			{wait, 3, 1}, {wait, 3, 2}, {grant, 3, 2}, {grant, 3, 1},
		}, 0, 0, false},
		{"granted twice", []laneStep{{wait, 1, 1}, {grant, 1, 1}, {grant, 1, 1}}, 0, 0, true},
		{"left another lane", []laneStep{{wait, 1, 1}, {grant, 2, 1}}, 0, 0, true},
		{"abandoned without waiting", []laneStep{{abandon, 1, 1}}, 0, 0, true},
		{"no such lane", []laneStep{{wait, pipeline.NumLanes, 1}}, 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := checkOrder(tt.steps)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if got.violations != tt.violations || got.strict != tt.strict {
				t.Errorf("violations %d, strict %d; want %d, %d", got.violations, got.strict, tt.violations, tt.strict)
			}
		})
	}
}

// The recorder numbers the requests of several pools in one order, so that
// a request waiting in one pool is older than one reaching another later.
func TestLaneRecorderMergesPools(t *testing.T) {
	var r laneRecorder
	a, b := r.observer(0), r.observer(1)
	a(pipeline.LaneEvent{Kind: pipeline.LaneWaiting, Lane: 0, Seq: 1})
	b(pipeline.LaneEvent{Kind: pipeline.LaneGranted, Lane: 2, Seq: 1}) // pool b's request 1 is another request
	a(pipeline.LaneEvent{Kind: pipeline.LaneGranted, Lane: 0, Seq: 1})
	r.stop()
	a(pipeline.LaneEvent{Kind: pipeline.LaneWaiting, Lane: 0, Seq: 2})
	got, err := checkOrder(r.steps())
	if err != nil {
		t.Fatal(err)
	}
	if got.violations != 1 || got.waited != 1 || got.grants[0] != 1 || got.grants[2] != 1 {
		t.Errorf("%+v", got)
	}
}
