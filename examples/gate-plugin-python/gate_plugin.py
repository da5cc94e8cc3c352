#!/usr/bin/python3
"""A sluice gate plugin in Python: the same gate as examples/gate-plugin (Go).

Budget is the number in a file (gate_params.file), read on every query, or a
constant (gate_params.budget) when no file is given. Admit (asked per request
when gate_params.admit is "true") rejects requests whose metadata tenant is in
deny_tenants and defers those in defer_tenants by defer_delay.

The shebang names Debian's interpreter, which has python3-grpcio,
python3-protobuf and python3-cryptography; goplugin.py speaks go-plugin's
handshake. See README.md.
"""

import math
import re
import sys
import threading

# No __pycache__ beside the plugin: its directory may be read-only.
sys.dont_write_bytecode = True

import goplugin  # noqa: E402
from goplugin import GateError, gate_pb2  # noqa: E402

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def parse_duration_ms(name, value):
    """Reads a duration such as "250ms", "1.5s", "2m" or "1h" into milliseconds."""
    m = _DURATION.match(value)
    if not m:
        raise ValueError('gate_params.%s: %r is not a duration (like "250ms", "1s", "2m")' % (name, value))
    ms = float(m.group(1)) * _UNITS_MS[m.group(2)]
    if ms <= 0:
        raise ValueError("gate_params.%s: %s is not positive" % (name, value))
    return int(ms)


def parse_budget(where, text):
    try:
        b = float(text.strip())
    except ValueError:
        raise ValueError("%s: %r is not a number" % (where, text.strip()))
    if math.isnan(b) or b < 0 or b > 1:
        raise ValueError("%s: %s is outside [0,1]" % (where, text.strip()))
    return b


def tenant_set(text):
    return frozenset(s.strip() for s in text.split(",") if s.strip())


class FileGate(goplugin.Gate):
    """The example gate. Configure runs once; the other calls only read."""

    admitter = True

    def __init__(self):
        self._lock = threading.Lock()
        self._file = ""
        self._budget = 1.0
        self._deny = frozenset()
        self._defer = frozenset()
        self._defer_ms = 1000
        self._tenant_key = "tenant"

    def configure(self, params):
        params = dict(params)
        try:
            if "file" in params and "budget" in params:
                raise ValueError("gate_params.file and gate_params.budget exclude each other")
            file = params.pop("file", "").strip()
            budget = parse_budget("gate_params.budget", params.pop("budget", "1"))
            deny = tenant_set(params.pop("deny_tenants", ""))
            deferred = tenant_set(params.pop("defer_tenants", ""))
            defer_ms = parse_duration_ms("defer_delay", params.pop("defer_delay", "1s"))
            tenant_key = params.pop("tenant_key", "tenant").strip()
            if not tenant_key:
                raise ValueError("gate_params.tenant_key is empty")
        except ValueError as e:
            return str(e)
        if params:
            return "unknown gate_params: " + ", ".join(sorted(params))
        with self._lock:
            self._file, self._budget = file, budget
            self._deny, self._defer, self._defer_ms = deny, deferred, defer_ms
            self._tenant_key = tenant_key
        return ""

    def budget(self, context):
        with self._lock:
            file, budget = self._file, self._budget
        if not file:
            return budget
        try:
            with open(file) as f:
                text = f.read()
        except OSError as e:
            raise GateError("read budget: %s" % e)
        try:
            return parse_budget("budget file " + file, text)
        except ValueError as e:
            raise GateError(str(e))

    def admit(self, request, context):
        with self._lock:
            tenant = request.metadata.get(self._tenant_key, "")
            if tenant in self._deny:
                return gate_pb2.VERDICT_REJECT, 0, "tenant %s is denied" % tenant
            if tenant in self._defer:
                return gate_pb2.VERDICT_DEFER, self._defer_ms, "tenant %s is deferred" % tenant
        return gate_pb2.VERDICT_ADMIT, 0, ""

    def describe(self):
        with self._lock:
            if self._file:
                return "when the number in %s is 0 (python)" % self._file
            return "budget %g set in gate_params (python)" % self._budget


if __name__ == "__main__":
    goplugin.serve(FileGate())
