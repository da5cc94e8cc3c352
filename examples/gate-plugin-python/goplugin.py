"""Serve a sluice gate from Python, speaking hashicorp/go-plugin's handshake.

sluice runs a gate plugin through go-plugin: it starts the executable with a
few environment variables, reads one line from its stdout to learn where to
connect, and talks gRPC to it. This module does the plugin's side of that, so
that a gate only implements the four calls of sluice's gate protocol
(plugins/sdk/gatepb/gate.proto, package sluice.gate.v1):

1. The magic cookie: SLUICE_GATE_PLUGIN must hold the value below, else the
   program was started by hand; it says so on stderr and exits 1.
2. The protocol version: PLUGIN_PROTOCOL_VERSIONS lists the versions the host
   speaks (comma-separated); this plugin speaks version 1 and says so. A host
   that does not list 1 refuses the plugin after reading the line.
3. A gRPC server on a Unix socket in a fresh private directory (under
   PLUGIN_UNIX_SOCKET_DIR when set, as go-plugin's own servers do), serving
   the Gate service, grpc.health.v1.Health (Check answers SERVING) and
   go-plugin's plugin.GRPCController (Shutdown stops the server and the
   process exits).
4. AutoMTLS: when the host sets PLUGIN_CLIENT_CERT (its client certificate,
   PEM), the server makes a self-signed certificate for "localhost", serves
   TLS with it, requires and verifies the host's certificate, and appends
   its own certificate (DER, base64 standard alphabet without padding) to
   the handshake line. Without PLUGIN_CLIENT_CERT it serves plain gRPC.
5. The handshake line on stdout, then nothing else on stdout:
   CORE-PROTOCOL-VERSION|APP-PROTOCOL-VERSION|NETWORK|ADDRESS|grpc[|SERVER-CERT]
   for example 1|1|unix|/tmp/plugin123/plugin.sock|grpc

Logs go to stderr as hclog JSON lines ({"@level": ..., "@message": ...}), so
that sluice relays them at their level.
"""

import base64
import datetime
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from concurrent import futures

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen"))

import gate_pb2  # noqa: E402  (generated from plugins/sdk/gatepb/gate.proto)
import goplugin_pb2  # noqa: E402  (go-plugin's controller service)
import health_pb2  # noqa: E402  (grpc.health.v1)

# What the host and the plugin agree on (plugins/sdk's Handshake).
MAGIC_COOKIE_KEY = "SLUICE_GATE_PLUGIN"
MAGIC_COOKIE_VALUE = "6f0c1d2e-sluice-gate-v1"
APP_PROTOCOL_VERSION = 1
# go-plugin's own protocol version (the first field of the handshake line).
CORE_PROTOCOL_VERSION = 1


def log(level, message, **fields):
    """Writes one hclog JSON line to stderr (level: trace, debug, info, warn, error)."""
    entry = {"@level": level, "@message": message, "@module": "gate-plugin-python"}
    entry.update(fields)
    sys.stderr.write(json.dumps(entry) + "\n")
    sys.stderr.flush()


class Gate:
    """What a gate implements. Every method may be called from many threads at once.

    configure(params) -> str: an error message ("" when the parameters are fine).
    budget(context) -> float in [0, 1]; raise GateError when it cannot tell.
    admit(request, context) -> (verdict, delay_ms, reason), verdict one of
        gate_pb2.VERDICT_ADMIT, VERDICT_DEFER, VERDICT_REJECT.
    describe() -> str: when the gate closes, in one line.
    admitter: True when admit decides per request.
    """

    admitter = False

    def configure(self, params):
        return "unknown gate_params: " + ", ".join(sorted(params)) if params else ""

    def budget(self, context):
        raise NotImplementedError

    def admit(self, request, context):
        return gate_pb2.VERDICT_ADMIT, 0, ""

    def describe(self):
        return ""


class GateError(Exception):
    """A gate's own failure: the host sees a failed query (gRPC UNKNOWN)."""


class _GateService:
    """Maps the Gate service's calls onto a Gate, as plugins/sdk's server does in Go."""

    def __init__(self, gate):
        self._gate = gate
        self._lock = threading.Lock()
        self._configured = False

    def configure(self, request, context):
        with self._lock:
            resp = gate_pb2.ConfigureResponse(admitter=bool(self._gate.admitter))
            if self._configured:
                resp.error = "configured twice"
                return resp
            err = self._gate.configure(dict(request.params))
            if err:
                resp.error = err
                return resp
            self._configured = True
            return resp

    def budget(self, request, context):
        try:
            b = float(self._gate.budget(context))
        except GateError as e:
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        return gate_pb2.BudgetResponse(budget=b)

    def admit(self, request, context):
        try:
            verdict, delay_ms, reason = self._gate.admit(request, context)
        except GateError as e:
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        return gate_pb2.AdmitResponse(verdict=verdict, delay_ms=int(delay_ms), reason=reason)

    def describe(self, request, context):
        return gate_pb2.DescribeResponse(description=self._gate.describe())


def _unary(fn, request_type, response_type):
    return grpc.unary_unary_rpc_method_handler(
        fn,
        request_deserializer=request_type.FromString,
        response_serializer=response_type.SerializeToString,
    )


def _server_credentials(client_cert_pem):
    """AutoMTLS: a fresh self-signed certificate for localhost, and TLS that
    requires the host's certificate. Returns the credentials and the
    certificate as the handshake carries it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(seconds=30))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=True,
                crl_sign=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    creds = grpc.ssl_server_credentials(
        [(key_pem, cert_pem)], root_certificates=client_cert_pem.encode(), require_client_auth=True
    )
    der = cert.public_bytes(serialization.Encoding.DER)
    return creds, base64.b64encode(der).decode().rstrip("=")


def serve(gate, max_workers=16):
    """Serves gate until the host asks the plugin to shut down; never returns."""
    if os.environ.get(MAGIC_COOKIE_KEY) != MAGIC_COOKIE_VALUE:
        sys.stderr.write(
            "This program is a sluice gate plugin: sluice starts it (gate_type \"plugin\",\n"
            "gate_params.path). It does nothing when run by hand.\n"
        )
        sys.exit(1)
    versions = [v.strip() for v in os.environ.get("PLUGIN_PROTOCOL_VERSIONS", "").split(",") if v.strip()]
    if versions and str(APP_PROTOCOL_VERSION) not in versions:
        log("warn", "the host does not speak this plugin's protocol version",
            plugin=APP_PROTOCOL_VERSION, host=",".join(versions))

    # go-plugin's own servers ignore interrupts: Ctrl-C reaches the whole
    # process group, and the host decides when its plugins stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
    svc = _GateService(gate)
    stopped = threading.Event()

    def shutdown(request, context):
        stopped.set()
        return goplugin_pb2.Empty()

    def health(request, context):
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    server.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler("sluice.gate.v1.Gate", {
            "Configure": _unary(svc.configure, gate_pb2.ConfigureRequest, gate_pb2.ConfigureResponse),
            "Budget": _unary(svc.budget, gate_pb2.BudgetRequest, gate_pb2.BudgetResponse),
            "Admit": _unary(svc.admit, gate_pb2.AdmitRequest, gate_pb2.AdmitResponse),
            "Describe": _unary(svc.describe, gate_pb2.DescribeRequest, gate_pb2.DescribeResponse),
        }),
        grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
            "Check": _unary(health, health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse),
        }),
        grpc.method_handlers_generic_handler("plugin.GRPCController", {
            "Shutdown": _unary(shutdown, goplugin_pb2.Empty, goplugin_pb2.Empty),
        }),
    ))

    sock_dir = tempfile.mkdtemp(prefix="plugin", dir=os.environ.get("PLUGIN_UNIX_SOCKET_DIR") or None)
    sock = os.path.join(sock_dir, "plugin.sock")
    client_cert = os.environ.get("PLUGIN_CLIENT_CERT", "")
    server_cert = ""
    if client_cert:
        creds, server_cert = _server_credentials(client_cert)
        server.add_secure_port("unix:" + sock, creds)
    else:
        server.add_insecure_port("unix:" + sock)
    server.start()

    line = "%d|%d|unix|%s|grpc" % (CORE_PROTOCOL_VERSION, APP_PROTOCOL_VERSION, sock)
    if server_cert:
        line += "|" + server_cert
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    log("debug", "plugin serving", address=sock, tls=bool(server_cert))

    # SIGTERM ends the process as Shutdown does.
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        while not stopped.wait(1):
            pass
    finally:
        server.stop(1).wait()
        shutil.rmtree(sock_dir, ignore_errors=True)
    sys.exit(0)
