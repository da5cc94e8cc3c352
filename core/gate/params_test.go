package gate

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func parseParams(t *testing.T, s string) Params {
	t.Helper()
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &obj); err != nil {
		t.Fatal(err)
	}
	p, err := ParseParams(obj)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestParamsUpstreamValueRules checks the readers against upstream's value
// rules (UPSTREAM.md §0.2): strings, numbers and booleans where upstream
// takes them; absent, null and "" read as the default.
func TestParamsUpstreamValueRules(t *testing.T) {
	p := parseParams(t, `{"s":"x","n":100.0,"f":0.25,"e":1e3,"neg":-2,"t":true,"fa":false,
		"ns":"0.5","is":"42","d":"250ms","dn":60,"null":null,"empty":"","obj":{"a":1},"arr":[1]}`)
	for _, c := range []struct{ key, def, want string }{
		{"s", "d", "x"},
		{"n", "d", "100"}, // shortest decimal form
		{"f", "d", "0.25"},
		{"e", "d", "1000"},
		{"neg", "d", "-2"},
		{"t", "d", "true"},
		{"fa", "d", "false"},
		{"null", "d", "d"},
		{"empty", "d", "d"},
		{"absent", "d", "d"},
		{"obj", "d", "d"}, // other types give the default
		{"arr", "d", "d"},
	} {
		if got := p.String(c.key, c.def); got != c.want {
			t.Errorf("String(%s) = %q, want %q", c.key, got, c.want)
		}
	}
	for _, c := range []struct {
		key  string
		want float64
		err  bool
	}{
		{"n", 100, false}, {"f", 0.25, false}, {"ns", 0.5, false}, {"empty", 7, false}, {"null", 7, false},
		{"absent", 7, false}, {"s", 0, true}, {"t", 0, true}, {"obj", 0, true},
	} {
		got, err := p.Float(c.key, 7)
		if (err != nil) != c.err || (!c.err && got != c.want) {
			t.Errorf("Float(%s) = %v, %v; want %v (error %v)", c.key, got, err, c.want, c.err)
		}
	}
	for _, c := range []struct {
		key  string
		want int
		err  bool
	}{
		{"n", 100, false}, {"is", 42, false}, {"e", 1000, false}, {"absent", 7, false}, {"f", 0, true}, {"s", 0, true},
	} {
		got, err := p.Int(c.key, 7)
		if (err != nil) != c.err || (!c.err && got != c.want) {
			t.Errorf("Int(%s) = %v, %v; want %v (error %v)", c.key, got, err, c.want, c.err)
		}
	}
	if d, err := p.Duration("d", 0); err != nil || d != 250*time.Millisecond {
		t.Errorf("Duration(d) = %v, %v", d, err)
	}
	if d, err := p.Duration("dn", 0); err != nil || d != time.Minute { // sluice also takes seconds
		t.Errorf("Duration(dn) = %v, %v", d, err)
	}
	if d, err := p.Duration("empty", time.Second); err != nil || d != time.Second {
		t.Errorf("Duration(empty) = %v, %v", d, err)
	}
	if p.Has("null") || p.Has("empty") || !p.Has("t") || !p.Has("obj") {
		t.Error("Has: null and \"\" must read as absent")
	}
}

// TestParamsRawFromString: upstream's composite takes "gates" as an array
// or as a JSON string holding one (and a single "gate" likewise).
func TestParamsRawFromString(t *testing.T) {
	arr := parseParams(t, `{"gates":[{"gate_type":"constant","gate_params":{"budget":0.5}}]}`)
	str := parseParams(t, `{"gates":"[{\"gate_type\":\"constant\",\"gate_params\":{\"budget\":0.5}}]","gate":" {\"gate_type\":\"constant\"}"}`)
	var a, s []map[string]any
	if err := json.Unmarshal(arr.Raw("gates"), &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(str.Raw("gates"), &s); err != nil {
		t.Fatalf("gates as a JSON string: %v (raw %s)", err, str.Raw("gates"))
	}
	if len(a) != 1 || len(s) != 1 || s[0]["gate_type"] != "constant" {
		t.Fatalf("array %v, string %v", a, s)
	}
	if r := str.Raw("gate"); !strings.HasPrefix(string(r), "{") {
		t.Errorf("single gate as a JSON string: %s", r)
	}
	if err := str.Unused(); err != nil {
		t.Errorf("Raw must mark the key used: %v", err)
	}
	if r := parseParams(t, `{"gates":"not json","n":1}`).Raw("gates"); r != nil {
		t.Errorf("a plain string is no nested value: %s", r)
	}
	if r := parseParams(t, `{"gates":"[oops"}`).Raw("gates"); string(r) != "[oops" {
		t.Errorf("bad JSON is handed to the caller's decoder to report: %q", r)
	}
	same := parseParams(t, `{"gates":"[ {\"gate_type\": \"constant\", \"gate_params\": {\"budget\": 0.5}} ]"}`)
	if arr.Canonical() != same.Canonical() {
		t.Errorf("an array and a string holding it read differently:\n%s\n%s", arr.Canonical(), same.Canonical())
	}
}

func TestParseParamsRejectsGarbage(t *testing.T) {
	if _, err := ParseParams(map[string]json.RawMessage{"x": json.RawMessage(`nope`)}); err == nil {
		t.Error("want an error for a value that is no JSON scalar")
	}
}

func TestParamsStringMap(t *testing.T) {
	want := map[string]string{"tier": "batch", "n": "3", "on": "true"}
	for _, doc := range []string{
		`{"m":{"tier":"batch","n":3.0,"on":true}}`,
		`{"m":"{\"tier\":\"batch\",\"n\":3,\"on\":true}"}`,
	} {
		p := parseParams(t, doc)
		got, err := p.StringMap("m")
		if err != nil || len(got) != len(want) {
			t.Fatalf("%s: %v %v", doc, got, err)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %s = %q, want %q", doc, k, got[k], v)
			}
		}
		if err := p.Unused(); err != nil {
			t.Errorf("StringMap must mark the key used: %v", err)
		}
	}
	p := parseParams(t, `{"s":"plain","a":[1],"bad":"{oops"}`)
	if m, err := p.StringMap("absent"); m != nil || err != nil {
		t.Errorf("absent: %v %v", m, err)
	}
	for _, k := range []string{"s", "a", "bad"} {
		if _, err := p.StringMap(k); err == nil {
			t.Errorf("StringMap(%s): want an error", k)
		}
	}
}
