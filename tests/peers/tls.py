"""Throwaway TLS for the test peers: a self-signed certificate that is its own CA bundle, or
a CA with a server and a client certificate for peers that ask for client certificates."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def self_signed(directory: Path, stem: str, common_name: str) -> tuple[Path, Path]:
    """``STEM.crt`` and ``STEM.key`` for localhost and 127.0.0.1, valid for two days.

    Clients verify against the certificate itself (``ca_file``), so TLS stays verified
    in tests as it is by default in the site file.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@dataclass(frozen=True)
class MutualTls:
    """A CA, a server certificate it signed (for 127.0.0.1 and localhost, good for serving
    and for a member's own client calls) and a client certificate it signed: what etcd's
    ``--client-cert-auth`` needs (TEST-PEERS.md, etcd with TLS). ``stranger_*`` is a client
    certificate of another CA (``stranger_ca``), which neither side may trust."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path
    stranger_ca: Path


def mutual_tls(directory: Path) -> MutualTls:
    """The files of ``MutualTls`` in ``directory``, valid for two days."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _authority("upsguard test CA")
    server_sans = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    server_usage = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    client_usage = [ExtendedKeyUsageOID.CLIENT_AUTH]
    stranger_key, stranger_ca = _authority("another CA")
    files = {
        "server": _signed(ca_key, ca_cert, "etcd", server_usage, server_sans),
        "client": _signed(ca_key, ca_cert, "upsguard", client_usage, None),
        "stranger": _signed(stranger_key, stranger_ca, "upsguard", client_usage, None),
    }
    (directory / "ca.crt").write_bytes(_pem_cert(ca_cert))
    (directory / "stranger-ca.crt").write_bytes(_pem_cert(stranger_ca))
    paths: dict[str, Path] = {}
    for stem, (key, cert) in files.items():
        paths[f"{stem}_cert"] = directory / f"{stem}.crt"
        paths[f"{stem}_key"] = directory / f"{stem}.key"
        paths[f"{stem}_cert"].write_bytes(_pem_cert(cert))
        paths[f"{stem}_key"].write_bytes(_pem_key(key))
        paths[f"{stem}_key"].chmod(0o600)
    return MutualTls(ca=directory / "ca.crt", stranger_ca=directory / "stranger-ca.crt", **paths)


def _authority(common_name: str) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _signed(
    ca_key: Any, ca_cert: Any, common_name: str, usage: list[Any], sans: Any
) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    )
    if sans is not None:
        builder = builder.add_extension(sans, critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _name(common_name: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_cert(cert: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    data: bytes = cert.public_bytes(serialization.Encoding.PEM)
    return data


def _pem_key(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    data: bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return data
