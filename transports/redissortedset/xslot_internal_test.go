package redissortedset

import (
	"bytes"
	"testing"
)

// TestSettleRecordRoundTrip: a settling record reads back as written,
// whatever bytes its list, payload key and result hold (the separator
// included), and a truncated one is refused.
func TestSettleRecordRoundTrip(t *testing.T) {
	for _, r := range []settleRecord{
		{leaseMS: 15000, windowMS: 120000, mode: 'r', ttl: 0, list: "llm-d-async:results:pool-a:$batch", result: []byte(`{"id":"a","payload":"x|y"}`)},
		{leaseMS: 1, windowMS: 2, mode: 'b', ttl: 3600, list: "a|b", payloadKey: "request-payload:id|1:tok", result: []byte("|||")},
		{leaseMS: 600, windowMS: 120000, mode: 'r', list: "l"},
	} {
		stored := "owner:1:2|" + r.encode()
		tok, got, err := parseStoredRecord(stored)
		if err != nil {
			t.Fatalf("%q: %v", stored, err)
		}
		if tok != "owner:1:2" || got.leaseMS != r.leaseMS || got.windowMS != r.windowMS || got.mode != r.mode || got.ttl != r.ttl ||
			got.list != r.list || got.payloadKey != r.payloadKey || !bytes.Equal(got.result, r.result) {
			t.Errorf("%q read back as %q %+v, want %+v", stored, tok, got, r)
		}
		if _, _, err := parseStoredRecord(stored[:len("owner:1:2|")+len(r.encode())/2]); err == nil && len(r.list)+len(r.payloadKey) > 2 {
			t.Errorf("a truncated record %q was accepted", stored[:len(stored)/2])
		}
	}
}
