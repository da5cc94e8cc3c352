package wire

import "testing"

func TestSetInternal(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		set      []InternalMember
		want     string
	}{
		{"replaces and adds", `{"internal":{"queue_id":"","request_token":"t"},"request_kind":"plain","data":{"id":"a"}}`,
			[]InternalMember{{"queue_id", []byte(`"q"`)}, {"result_routing_resolved", []byte("true")}},
			`{"internal":{"result_routing_resolved":true,"queue_id":"q","request_token":"t"},"request_kind":"plain","data":{"id":"a"}}`},
		{"no internal", `{"request_kind":"plain","data":{"id":"a"}}`,
			[]InternalMember{{"request_queue_name", []byte(`"Q"`)}},
			`{"internal":{"request_queue_name":"Q"},"request_kind":"plain","data":{"id":"a"}}`},
		{"nothing to set", `{"data":{}}`, nil, `{"data":{}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SetInternal([]byte(tc.in), tc.set...)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
	if _, err := SetInternal([]byte(`[1]`), InternalMember{"a", []byte("1")}); err == nil {
		t.Error("stamped a JSON array")
	}
}

func TestWithPayload(t *testing.T) {
	for _, tc := range []struct {
		name, in, payload, want string
	}{
		{"attach", `{"internal":{"payload_ref":"k"},"data":{"id":"a","payload":null,"deadline":1}}`, `{"p":1}`,
			`{"internal":{"payload_ref":"k"},"data":{"id":"a","payload":{"p":1},"deadline":1}}`},
		{"detach", `{"data":{"id":"a","payload":{"p":1}}}`, `null`, `{"data":{"id":"a","payload":null}}`},
		{"missing member", `{"data":{"id":"a"}}`, `{}`, `{"data":{"payload":{},"id":"a"}}`},
		{"empty data", `{"data":{}}`, `{}`, `{"data":{"payload":{}}}`},
		{"last data wins", `{"data":{"payload":1},"data":{"payload":2}}`, `3`, `{"data":{"payload":1},"data":{"payload":3}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := WithPayload([]byte(tc.in), []byte(tc.payload))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
	for _, bad := range []string{`{"id":"a"}`, `{"data":null}`, `nope`} {
		if _, err := WithPayload([]byte(bad), []byte("{}")); err == nil {
			t.Errorf("%s: attached a payload", bad)
		}
	}
}
