"""A throwaway PKI for TLS tests, made with `cryptography`: a CA, a server certificate for localhost and
127.0.0.1 and a client certificate it signed, and another CA that signed neither."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path
    other_ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_key: Path


def make_pki(directory: Path) -> Pki:
    """Every file of the PKI, PEM, in `directory`."""
    ca_key, other_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(4))
    ca = _issue("graphledger test CA", ca_key, None)
    other_ca = _issue("some other CA", other_key, None)
    d = directory
    return Pki(
        ca=_write(d / "ca.crt", ca),
        other_ca=_write(d / "other-ca.crt", other_ca),
        server_cert=_write(d / "server.crt", _issue("localhost", server_key, (ca, ca_key), server=True)),
        server_key=_write(d / "server.key", server_key),
        client_cert=_write(d / "client.crt", _issue("graphledger-agent", client_key, (ca, ca_key))),
        client_key=_write(d / "client.key", client_key),
        other_key=_write(d / "other.key", other_key),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer[0].subject if issuer else _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if issuer is None:  # a CA
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer[1].public_key()), critical=False
        )
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if server:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def _write(path: Path, *items: x509.Certificate | ec.EllipticCurvePrivateKey) -> Path:
    chunks = []
    for item in items:
        if isinstance(item, x509.Certificate):
            chunks.append(item.public_bytes(serialization.Encoding.PEM))
        else:
            chunks.append(
                item.private_bytes(
                    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
                )
            )
    path.write_bytes(b"".join(chunks))
    return path
