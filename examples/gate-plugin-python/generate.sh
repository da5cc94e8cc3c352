#!/bin/sh
# Regenerates the Python message modules in gen/ from the gate protocol
# (plugins/sdk/gatepb/gate.proto) and the two go-plugin protocols in proto/.
# Needs protoc (Debian: protobuf-compiler) of the same minor version as the
# Python protobuf runtime (Debian bookworm: both 3.21). Only messages are
# generated (--python_out): gate_plugin.py registers the services itself with
# grpc's generic handlers, so grpcio-tools is not needed.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
gate_proto_dir=${GATE_PROTO_DIR:-$root/plugins/sdk/gatepb}
protoc -I "$gate_proto_dir" --python_out="$here/gen" "$gate_proto_dir/gate.proto"
protoc -I "$here/proto" --python_out="$here/gen" "$here/proto/health.proto" "$here/proto/goplugin.proto"
