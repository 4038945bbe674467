"""A real Redis server with a password and TLS only (no plain port), for the ``rediss://`` tests
(libs/horde-core/tests/test_redis_tls.py, tests/e2e/test_redis_tls_e2e.py).

The certificates are made here (``cryptography``): a CA and a server certificate for ``127.0.0.1`` and
``localhost`` signed by it. The server is Debian's ``redis-server`` (built with TLS; the embedded Valkey wheel is
not), installed on first use (:mod:`horde_testing.apt`), run through the one process launcher:

    with TlsRedis() as server:
        server.url()  # rediss://:<password>@127.0.0.1:<port>/0?ssl_ca_certs=<ca.pem>
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import secrets
import shutil
import socket
import ssl
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from horde_testing.apt import debian_binary, find_binary
from horde_testing.launcher import ServiceError, ServiceProcess, free_port

DEBIAN_BINARY = "/usr/bin/redis-server"


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the CA's certificate, the server's certificate and its key."""

    ca: Path
    cert: Path
    key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """A CA and a server certificate (SAN ``127.0.0.1``, ``localhost``) signed by it, valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "horde test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(ca=directory / "ca.pem", cert=directory / "server.pem", key=directory / "server.key")
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return files


def find_redis_server() -> str | None:
    return find_binary("redis-server", [DEBIAN_BINARY])


class TlsRedis:
    """``redis-server`` on a free loopback port, TLS only, ``requirepass`` set (see the module). Clients need no
    certificate of their own (``tls-auth-clients no``)."""

    def __init__(self, password: str | None = None) -> None:
        self.password = password or secrets.token_urlsafe(16)
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="horde-redis-tls-"))
        self.tls = make_tls_files(self.dir)
        argv = [
            debian_binary("redis-server", "redis-server", [DEBIAN_BINARY]),
            "--port",
            "0",
            "--tls-port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            str(self.tls.cert),
            "--tls-key-file",
            str(self.tls.key),
            "--tls-ca-cert-file",
            str(self.tls.ca),
            "--tls-auth-clients",
            "no",
            "--requirepass",
            self.password,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
        ]
        self.process = ServiceProcess("redis-tls", argv, {}, None)

    def url(self, db: int = 0, *, ca: bool = True, password: str | None = None) -> str:
        """``rediss://:<password>@127.0.0.1:<port>/<db>``, with ``?ssl_ca_certs=<the CA file>`` unless ``ca`` is
        False (then the system's trust store, which does not know this CA)."""
        secret = quote(self.password if password is None else password, safe="")
        base = f"rediss://:{secret}@127.0.0.1:{self.port}/{db}"
        return f"{base}?ssl_ca_certs={quote(str(self.tls.ca), safe='/')}" if ca else base

    def _handshake_ok(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1"),
        ):
            return True
        return False

    def start(self, timeout: float = 30.0) -> TlsRedis:
        self.process.start()
        deadline = time.monotonic() + timeout
        while not self._handshake_ok():
            if not self.process.running:
                raise ServiceError(f"redis-server exited\n{self.process.log_tail()}")
            if time.monotonic() >= deadline:
                raise ServiceError(
                    f"redis-server (TLS) not ready after {timeout:.0f}s\n{self.process.log_tail()}"
                )
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.process.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> TlsRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
