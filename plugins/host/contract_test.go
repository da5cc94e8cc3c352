package host_test

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/plugins/sdk"
	"github.com/sluice-io/sluice/plugins/sdk/gatepb"
)

// The SDK is its own module with few dependencies, so it keeps a copy of the
// gate contract instead of importing core/gate. These tests keep the copy
// identical: a verdict, a decision field or a parameter reader that drifts
// from core's fails here.

// Every verdict has the same value and name in core, the SDK and the wire
// enum (VERDICT_<NAME>), and none exists in one only.
func TestSDKVerdictsMatchCore(t *testing.T) {
	named := func(s string) bool { return !strings.HasPrefix(s, "verdict(") }
	var n int
	for v := 0; v < 64; v++ {
		c, s := gate.Verdict(v).String(), sdk.Verdict(v).String()
		if named(c) != named(s) {
			t.Errorf("verdict %d: core %q, sdk %q", v, c, s)
			continue
		}
		if !named(c) {
			continue
		}
		n++
		if c != s {
			t.Errorf("verdict %d: core names it %q, the SDK %q", v, c, s)
		}
		if w := gatepb.Verdict(v).String(); w != "VERDICT_"+strings.ToUpper(c) {
			t.Errorf("verdict %d (%s): the wire enum names it %s", v, c, w)
		}
	}
	if n != 4 || len(gatepb.Verdict_name) != n {
		t.Errorf("%d named verdicts in core and the SDK, %d in the wire enum; want 4 each (admit, defer, reject, wait)", n, len(gatepb.Verdict_name))
	}
	for _, v := range []struct {
		c gate.Verdict
		s sdk.Verdict
	}{{gate.Admit, sdk.Admit}, {gate.Defer, sdk.Defer}, {gate.Reject, sdk.Reject}, {gate.Wait, sdk.Wait}} {
		if int(v.c) != int(v.s) {
			t.Errorf("%s: core %d, sdk %d", v.c, v.c, v.s)
		}
	}
	if sdk.Admitted.Verdict.String() != gate.Admitted.Verdict.String() {
		t.Errorf("Admitted: core %s, sdk %s", gate.Admitted.Verdict, sdk.Admitted.Verdict)
	}
}

// The SDK's Decision has core's fields of the same names and kinds (core
// has more: a result and a release, which a plugin cannot send).
func TestSDKDecisionMatchesCore(t *testing.T) {
	ct, st := reflect.TypeOf(gate.Decision{}), reflect.TypeOf(sdk.Decision{})
	for i := range st.NumField() {
		sf := st.Field(i)
		cf, ok := ct.FieldByName(sf.Name)
		switch {
		case !ok:
			t.Errorf("sdk.Decision.%s has no counterpart in gate.Decision", sf.Name)
		case cf.Type.Kind() != sf.Type.Kind() || cf.Type.Name() != sf.Type.Name():
			t.Errorf("Decision.%s: core %s, sdk %s", sf.Name, cf.Type, sf.Type)
		}
	}
	if st.NumField() != 3 {
		t.Errorf("sdk.Decision has %d fields; this test knows Verdict, Delay and Reason", st.NumField())
	}
}

// sdkOnly are the SDK's Params methods core has no counterpart of.
var sdkOnly = []string{"Bool"}

// The SDK's parameter readers are core's: the same methods with the same
// signatures, and for the same values the same answers and errors.
func TestSDKParamsMatchCore(t *testing.T) {
	ct, st := reflect.TypeOf(gate.Params{}), reflect.TypeOf(sdk.Params{})
	norm := func(m reflect.Type) string { // the signature, with each Params type named alike
		return strings.NewReplacer("gate.Params", "Params", "sdk.Params", "Params").Replace(m.String())
	}
	for i := range st.NumMethod() {
		sm := st.Method(i)
		if slices.Contains(sdkOnly, sm.Name) {
			continue
		}
		cm, ok := ct.MethodByName(sm.Name)
		switch {
		case !ok:
			t.Errorf("sdk.Params.%s has no counterpart in gate.Params (list it in sdkOnly if that is meant)", sm.Name)
		case norm(cm.Type) != norm(sm.Type):
			t.Errorf("Params.%s: core %s, sdk %s", sm.Name, norm(cm.Type), norm(sm.Type))
		}
	}

	vals := []string{"", "0", "3", "2.5", " 7 ", "-1", "1e3", "abc", "250ms", " 5s ", "1m30s", "1.5", "true", "x y"}
	for _, v := range vals {
		t.Run(fmt.Sprintf("%q", v), func(t *testing.T) {
			in := map[string]string{"k": v, "other": "1"}
			c, s := gate.NewParams(in), sdk.NewParams(in)
			same := func(what string, cv, sv any, cerr, serr error) {
				t.Helper()
				if fmt.Sprint(cv) != fmt.Sprint(sv) || fmt.Sprint(cerr) != fmt.Sprint(serr) {
					t.Errorf("%s: core %v, %v; sdk %v, %v", what, cv, cerr, sv, serr)
				}
			}
			same("Has", c.Has("k"), s.Has("k"), nil, nil)
			same("Has(absent)", c.Has("nope"), s.Has("nope"), nil, nil)
			same("Keys", c.Keys(), s.Keys(), nil, nil)
			same("String", c.String("k", "def"), s.String("k", "def"), nil, nil)
			cf, cerr := c.Float("k", 9)
			sf, serr := s.Float("k", 9)
			same("Float", cf, sf, cerr, serr)
			ci, cerr := c.Int("k", 9)
			si, serr := s.Int("k", 9)
			same("Int", ci, si, cerr, serr)
			cd, cerr := c.Duration("k", time.Hour)
			sd, serr := s.Duration("k", time.Hour)
			same("Duration", cd, sd, cerr, serr)
			same("Unused", nil, nil, c.Unused(), s.Unused())
		})
	}
}
