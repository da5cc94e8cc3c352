package simulator

import (
	"bytes"
	"encoding/json"
	"testing"
)

// refModel is what encoding/json makes of body: whether it is an object, and
// its top-level "model" if that is a string.
func refModel(body []byte) (model string, hasModel, ok bool) {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(body) {
		return "", false, false
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return "", false, false
	}
	raw, found := m["model"]
	if !found || len(raw) == 0 || raw[0] != '"' {
		return "", false, true
	}
	if err := json.Unmarshal(raw, &model); err != nil {
		return "", false, true
	}
	return model, true, true
}

var scanModelCases = []string{
	`{}`,
	` { } `,
	`{"model":"a"}`,
	`{"model" : "a\"b\\" , "x":1}`,
	`{"messages":[{"model":"inner"}],"model":"outer"}`,
	`{"a":{"model":"nested"},"b":[1,{"c":"}"}],"model":"m"}`,
	`{"model":null}`,
	`{"model":12}`,
	`{"model":{"name":"x"}}`,
	`{"model":"first","model":"last"}`,
	`{"x":"\"model\":\"fake\"","y":true,"z":-1.5e3}`,
	`{"model":"\u00e9\n"}`,
	"{\"model\":\"Qwen/Qwen3-0.6B\",\n\t\"max_tokens\":128}",
	`[]`,
	`null`,
	``,
	`{`,
	`{"model":"a"`,
	`{"model":"a"}]`,
	`{"model" "a"}`,
}

func TestScanModel(t *testing.T) {
	for _, body := range scanModelCases {
		checkScanModel(t, []byte(body))
	}
}

func FuzzScanModel(f *testing.F) {
	for _, c := range scanModelCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, body []byte) { checkScanModel(t, body) })
}

func checkScanModel(t *testing.T, body []byte) {
	t.Helper()
	raw, ok := scanModel(body)
	want, wantHas, wantOK := refModel(body)
	if ok != wantOK {
		t.Fatalf("scanModel(%q) ok = %v, want %v", body, ok, wantOK)
	}
	if (raw != nil) != wantHas {
		t.Fatalf("scanModel(%q) = %q, want a model: %v", body, raw, wantHas)
	}
	if raw == nil {
		return
	}
	var got string
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("scanModel(%q) = %q, not a JSON string: %v", body, raw, err)
	}
	if got != want {
		t.Fatalf("scanModel(%q) = %q, want %q", body, got, want)
	}
}

func TestScanModelAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race")
	}
	body := []byte(`{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"What is 2+2?"}],"max_tokens":128}`)
	if n := testing.AllocsPerRun(100, func() { scanModel(body) }); n != 0 {
		t.Fatalf("scanModel allocates %v times", n)
	}
}

func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"", "plain", `q"uote\back`, "ctl\x00\x1f\n", "é"} {
		var got string
		if err := json.Unmarshal(appendJSONString(nil, s), &got); err != nil || got != s {
			t.Errorf("appendJSONString(%q) round-trips to %q, %v", s, got, err)
		}
	}
}
