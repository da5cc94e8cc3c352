package boltstate

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/sluice-io/sluice/front/batch"
)

// Records are stored as a flag byte and the line; values earlier versions
// wrote as JSON are still read, and a key that is no index is an error.
func TestRecordEncoding(t *testing.T) {
	for _, r := range []batch.Record{
		{Index: 7, OK: true, Line: []byte(`{"id":"batch_req_x-7","custom_id":"a"}`)},
		{Index: 0, OK: false, Line: []byte(`{"id":"batch_req_x-0","error":{"code":"batch_expired"}}`)},
	} {
		legacy, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		for name, v := range map[string][]byte{"current": encodeRecord(r), "legacy json": legacy} {
			got, err := decodeRecord(indexKey(r.Index), v)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got.Index != r.Index || got.OK != r.OK || !bytes.Equal(got.Line, r.Line) {
				t.Errorf("%s: decoded %+v, want %+v", name, got, r)
			}
		}
	}
	if _, err := decodeRecord([]byte("x"), encodeRecord(batch.Record{Line: []byte("{}")})); err == nil {
		t.Error("a key that is no line index decoded")
	}
	// The line is lent, not copied (batch.State.Records: valid until fn
	// returns), and its capacity ends with it: appending to it cannot
	// write over bolt's memory.
	v := encodeRecord(batch.Record{Index: 1, OK: true, Line: []byte("{}")})
	got, _ := decodeRecord(indexKey(1), v)
	v[1] = 'X'
	if string(got.Line) != "X}" || cap(got.Line) != len(got.Line) {
		t.Errorf("the decoded line %q (cap %d) is not the stored bytes", got.Line, cap(got.Line))
	}
}
