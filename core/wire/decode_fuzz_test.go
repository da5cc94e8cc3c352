package wire

import (
	"bytes"
	"encoding/json"
	"maps"
	"reflect"
	"testing"
	"time"
)

// FuzzDecode checks Decode's invariants on arbitrary input: it never panics;
// a failure is a *DecodeError; a decoded request has an id, a deadline and a
// payload that is a JSON object copied byte for byte from the input; the
// fast path never disagrees with the field-by-field path; WithRetryCount,
// WithEnvelope, EncodeRequest and the result JSON round-trip.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		seedFlat,
		`{"request_kind":"redis","internal":{"retry_count":3,"queue_id":"q","request_token":"00112233aabbccdd","request_queue_name":"rq","result_queue_name":"res","labels":{"a":"b"}},"data":` + seedFlat + `}`,
		`{"id":"a","created":"1700000000.5","deadline":"1.7000864e9","payload":{"p":"caf\u00e9 \ud83d\ude00"},"metadata":{"n":42,"b":true,"z":null}}`,
		`{"internal":null,"Internal":{"RETRY_COUNT":1},"request_kind":"plain","data":{"ID":"a","deadline":1,"payload":{ }},"data":{"deadline":2.000000001}}`,
		`{"request_kind":"pubsub","data":{"id":"a","deadline":1700086400,"payload":{},"metadata":{"k":{}}}}`,
		`{"id":"a","deadline":1e-3,"payload":{},"headers":{"x y":"1"},"endpoint":"//host"}`,
		`{"id":7,"deadline":true,"payload":[]}`,
		`{"id":"a","id":null,"deadline":-0,"data":"x","payload":{"a":[1,{"b":null}]}}`,
		"  {\"id\":\"\\u0061\",\n\"deadline\":253402300799.9999,\"payload\":{\"\\\"\":\"\\\\\"}}\t",
		`{"request_kind":"redis","internal":{"labels":{"a":1,"b":null,"c":true},"Labels":7,"retry_count":1},"internal":{"LABELS":{"t":"batch"}},"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
		`{"internal":{"labels":{"k":[]}},"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
		`{"internal":{"labels":{"classification":"reserved"}},"internal":null,"request_kind":"plain","data":{"id":"a","deadline":1700086400,"payload":{}}}`,
		`{"id":"a","deadline":1700086400,"payload":{},"internal":{"labels":{"k\u00e9":"\ud83d\ude00"}}}`,
		`[{"id":"a"}]`,
		`{"id":"a","deadline":1700086400,"payload":{}`,
		"\xff\xfe",
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if sreq, senv, ok := scanMessage(b); ok {
			jreq, jenv, jok := decodeJSON(b)
			if !jok || !reflect.DeepEqual(sreq, jreq) || senv != jenv {
				t.Fatalf("scanMessage gave %+v (envelope %v), the encoding/json pass %+v (envelope %v, ok %v)", sreq, senv, jreq, jenv, jok)
			}
		}
		req, env, err := decode(b)
		slow, slowEnv, slowErr := decodeSlow(b)
		if err != nil {
			de, ok := err.(*DecodeError)
			if !ok {
				t.Fatalf("error %T %v is not a *DecodeError", err, err)
			}
			if de.Reason == "" {
				t.Fatalf("DecodeError without a reason: %+v", de)
			}
			if slowErr == nil || !reflect.DeepEqual(de, slowErr) {
				t.Fatalf("decode failed with %v, decodeSlow gave %+v, %v", err, slow, slowErr)
			}
			if _, err := WithRetryCount(b, 1); err == nil {
				t.Fatalf("WithRetryCount accepts what Decode refuses")
			}
			if _, err := WithEnvelope(b, 1, nil); err == nil {
				t.Fatalf("WithEnvelope accepts what Decode refuses")
			}
			return
		}
		if slowErr != nil || !reflect.DeepEqual(req, slow) || env != slowEnv {
			t.Fatalf("decode gave %+v (envelope %v), decodeSlow gave %+v, %v (envelope %v)", req, env, slow, slowErr, slowEnv)
		}
		if req.ID == "" || req.Deadline.IsZero() || !req.Deadline.After(time.Unix(0, 0)) {
			t.Fatalf("decoded request lacks an id or a deadline: %+v", req)
		}
		if !json.Valid(req.Payload) || req.Payload[0] != '{' || !bytes.Contains(b, req.Payload) {
			t.Fatalf("payload %q is not a JSON object found in the input", req.Payload)
		}

		n := len(b) % 1000
		out, err := WithRetryCount(b, n)
		if err != nil {
			t.Fatalf("WithRetryCount(_, %d): %v", n, err)
		}
		checkRetryRoundTrip(t, b, out, n)
		again, err := WithRetryCount(out, n+1)
		if err != nil {
			t.Fatalf("WithRetryCount twice: %v", err)
		}
		checkRetryRoundTrip(t, out, again, n+1)

		labels := fuzzLabels(b, req.Labels)
		relabelled, err := WithEnvelope(b, n, labels)
		if err != nil {
			t.Fatalf("WithEnvelope(_, %d, %v): %v", n, labels, err)
		}
		checkEnvelopeRoundTrip(t, b, relabelled, n, labels)
		if len(labels) == 0 && len(req.Labels) == 0 && !bytes.Equal(relabelled, out) {
			t.Fatalf("WithEnvelope(_, %d, %v) = %q, WithRetryCount = %q", n, labels, relabelled, out)
		}
		labels2 := fuzzLabels(relabelled, labels)
		if again, err = WithEnvelope(relabelled, n+2, labels2); err != nil {
			t.Fatalf("WithEnvelope twice: %v", err)
		}
		checkEnvelopeRoundTrip(t, relabelled, again, n+2, labels2)
		if again, err = WithRetryCount(relabelled, n+3); err != nil {
			t.Fatalf("WithRetryCount after WithEnvelope: %v", err)
		}
		checkRetryRoundTrip(t, relabelled, again, n+3)

		checkEncodeRoundTrip(t, req)

		res := ErrorResult(req, CodeInferenceError, string(b))
		std, err := json.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Marshal(); !bytes.Equal(got, std) {
			t.Fatalf("Result.Marshal = %s, json.Marshal = %s", got, std)
		}
		if _, err := DecodeResult(std); err != nil {
			t.Fatalf("DecodeResult(%s): %v", std, err)
		}
	})
}

// fuzzLabels derives labels from the fuzz input b and the labels old a
// request holds: none, old with the classification set, labels of text
// taken from b (valid UTF-8, so they round-trip exactly), or an empty map.
func fuzzLabels(b []byte, old map[string]string) map[string]string {
	text := string([]rune(string(b[:len(b)/3])))
	switch len(b) % 4 {
	case 0:
		return nil
	case 1:
		l := maps.Clone(old)
		if l == nil {
			l = map[string]string{}
		}
		l[LabelClassification] = ClassOverflow
		return l
	case 2:
		return map[string]string{DefaultTierLabel: TierBatch, text: text + "\x00<&>\u2028", "": ""}
	}
	return map[string]string{}
}

// checkEncodeRoundTrip checks that EncodeRequest(req) decodes back to req,
// times within the half millisecond EncodeRequest rounds them to.
func checkEncodeRoundTrip(t *testing.T, req *Request) {
	t.Helper()
	enc, err := EncodeRequest(req)
	if err != nil {
		// Only rounding to the millisecond can push a decodable time out.
		sec, ms := unixMillis(req.Deadline)
		if (sec == 0 && ms == 0) || sec > maxUnixSeconds {
			return
		}
		if sec, _ := unixMillis(req.Created); !req.Created.IsZero() && sec > maxUnixSeconds {
			return
		}
		t.Fatalf("EncodeRequest(%+v): %v", req, err)
	}
	got, err := Decode(enc)
	if err != nil {
		t.Fatalf("Decode(EncodeRequest(_) = %s): %v", enc, err)
	}
	want := *req
	want.Kind, want.RetryCount, want.Token, want.QueueID, want.Labels = "", 0, "", "", nil
	const roundingSlack = 500 * time.Microsecond
	if d := got.Deadline.Sub(req.Deadline); d > roundingSlack || d < -roundingSlack {
		t.Fatalf("deadline %v came back as %v", req.Deadline, got.Deadline)
	}
	if d := got.Created.Sub(req.Created); d > roundingSlack || d < -roundingSlack {
		t.Fatalf("created %v came back as %v", req.Created, got.Created)
	}
	want.Deadline, want.Created = got.Deadline, got.Created
	if d := diffRequest(got, &want); d != "" {
		t.Fatalf("EncodeRequest round trip of %s: %s", enc, d)
	}
}

// FuzzResultMarshal checks that Result.Marshal writes what json.Marshal
// writes and that DecodeResult reads it back.
func FuzzResultMarshal(f *testing.F) {
	f.Add("batch_req_xyz", 200, `{"id":"chatcmpl-1"}`, "job_id", "j", "", "")
	f.Add("<&>", 0, "\x00\u2028\xff", "k\n", "\"", string(CodeDeadlineExceeded), "deadline exceeded")
	f.Fuzz(func(t *testing.T, id string, status int, payload, key, value, code, msg string) {
		r := &Result{ID: id, StatusCode: status, Payload: payload, ErrorCode: ErrorCode(code), ErrorMessage: msg}
		if key != "" {
			r.Metadata = map[string]string{key: value, key + "2": value + value}
		}
		got := r.Marshal()
		std, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, std) {
			t.Fatalf("Marshal = %s, json.Marshal = %s", got, std)
		}
		back, err := DecodeResult(got)
		if id == "" {
			if err == nil {
				t.Fatal("DecodeResult accepted a result without an id")
			}
			return
		}
		var want Result
		if err := json.Unmarshal(std, &want); err != nil {
			t.Fatal(err)
		}
		if err != nil || !reflect.DeepEqual(*back, want) {
			t.Fatalf("DecodeResult(%s) = %+v, %v; want %+v", got, back, err, want)
		}
	})
}
