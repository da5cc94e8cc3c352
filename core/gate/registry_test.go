package gate

import (
	"encoding/json"
	"testing"
)

func TestParamsCanonical(t *testing.T) {
	parse := func(s string) Params {
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
	a := parse(`{"max_concurrency":"100","pool":"p","gates":[{"gate_type":"constant"}]}`)
	b := parse(`{"pool": "p", "gates": [ {"gate_type": "constant"} ], "max_concurrency": 100}`)
	if a.Canonical() != b.Canonical() {
		t.Errorf("equal params differ:\n%s\n%s", a.Canonical(), b.Canonical())
	}
	if c := parse(`{"max_concurrency":"101","pool":"p"}`); c.Canonical() == a.Canonical() {
		t.Error("different params read alike")
	}
}
