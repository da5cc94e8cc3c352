package wmtransport_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/wmtransport"
)

type sizedOptions struct {
	Window int `json:"window"`
}

// sizedBroker is a broker whose build fails on a window below 1.
type sizedBroker struct{ window int }

func newSizedBroker(o sizedOptions, _ transport.Env) (*sizedBroker, error) {
	if o.Window < 1 {
		return nil, errors.New("window: must be positive")
	}
	return &sizedBroker{o.Window}, nil
}

func (*sizedBroker) Publisher() message.Publisher                       { return nopPub{} }
func (*sizedBroker) Subscriber(string, int) (message.Subscriber, error) { return fakeSub{}, nil }
func (*sizedBroker) Close() error                                       { return nil }

// TestBuildBroker: a broker factory built on BuildBroker decodes strictly,
// hands the options to the broker's constructor and, when that fails,
// returns a nil Broker rather than a typed nil.
func TestBuildBroker(t *testing.T) {
	b, err := wmtransport.BuildBroker(json.RawMessage(`{"window":4}`), transport.Env{}, newSizedBroker)
	if err != nil {
		t.Fatal(err)
	}
	if sb, ok := b.(*sizedBroker); !ok || sb.window != 4 {
		t.Fatalf("broker %#v", b)
	}
	b, err = wmtransport.BuildBroker(json.RawMessage(`{"window":0}`), transport.Env{}, newSizedBroker)
	if err == nil || err.Error() != "window: must be positive" || b != nil {
		t.Fatalf("failed build: %#v, %v; want nil and the constructor's error", b, err)
	}
	b, err = wmtransport.BuildBroker(json.RawMessage(`{"windw":4}`), transport.Env{}, newSizedBroker)
	if err == nil || !strings.Contains(err.Error(), `unknown field "windw"`) || b != nil {
		t.Fatalf("unknown option: %#v, %v", b, err)
	}
}
