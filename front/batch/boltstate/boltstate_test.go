package boltstate_test

import (
	"path/filepath"
	"testing"

	"github.com/sluice-io/sluice/front/batch"
	"github.com/sluice-io/sluice/front/batch/boltstate"
	"github.com/sluice-io/sluice/front/batch/statetest"
)

func TestConformance(t *testing.T) {
	statetest.Run(t, func(t testing.TB) batch.State {
		s, err := boltstate.Open(filepath.Join(t.TempDir(), "state.db"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// A reopened store holds what was recorded (the state survives the process).
func TestReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := boltstate.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateJob(t.Context(), batch.Job{ID: "batch_x", Status: batch.StatusInProgress, Counts: batch.Counts{Total: 2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Record(t.Context(), "batch_x", []batch.Record{{Index: 1, OK: true, Line: []byte("{}")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = boltstate.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	j, err := s.GetJob(t.Context(), "batch_x")
	if err != nil || j.Counts.Completed != 1 || j.Counts.Total != 2 {
		t.Fatalf("after reopen: %+v, %v", j, err)
	}
}
