"""The front door's certificate and key, checked before HAProxy gets them (docs/tls.md).

HAProxy reads one PEM file holding the certificate chain (the server's certificate first, then its intermediates)
and the unencrypted private key; a wrong file only shows at the reload, where `haproxy -c` says little more than
"unable to load". Here the operator's PEM texts are read with `cryptography` (on the controller: ansible-core
depends on it) and every problem is named, before anything on the host changes: a chain that does not parse or is out
of order, a key that is encrypted or is not the certificate's, a certificate that has expired or expires within the
given days, a name the clients use that the certificate does not cover, a CA that did not issue the chain.
"""
from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from typing import List, Optional

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, ed448, padding, rsa
from cryptography.x509.oid import ExtensionOID


class TLSInputError(ValueError):
    """A certificate, key or name that HAProxy or the clients would refuse; the message says which and how to fix it."""


@dataclass
class CertificateReport:
    subject: str
    issuer: str
    names: List[str]
    not_before: str
    not_after: str
    days_left: int
    fingerprint_sha256: str
    chain_length: int
    key_type: str

    def to_dict(self) -> dict:
        return {"subject": self.subject, "issuer": self.issuer, "names": self.names, "not_before": self.not_before,
                "not_after": self.not_after, "days_left": self.days_left,
                "fingerprint_sha256": self.fingerprint_sha256, "chain_length": self.chain_length,
                "key_type": self.key_type}


def load_chain(text: str, what: str) -> List[x509.Certificate]:
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise TLSInputError(f"{what} holds no PEM certificate (no '-----BEGIN CERTIFICATE-----' line): give the "
                            "certificate in PEM form, the server's certificate first, then its intermediates")
    try:
        return x509.load_pem_x509_certificates(text.encode())
    except ValueError as error:
        raise TLSInputError(f"{what} does not parse as PEM certificates ({error}): give the certificate in PEM "
                            "form, the server's certificate first, then its intermediates") from error


def load_key(text: str, what: str):
    if "PRIVATE KEY-----" not in text:
        raise TLSInputError(f"{what} holds no PEM private key: give the key in PEM form "
                            "(-----BEGIN PRIVATE KEY----- or -----BEGIN RSA/EC PRIVATE KEY-----)")
    if "ENCRYPTED" in text:
        raise TLSInputError(f"{what} is encrypted: HAProxy cannot ask for a passphrase when it starts. Keep the key "
                            "itself in Ansible Vault and give it decrypted (openssl pkey -in KEY -out PLAIN)")
    try:
        return serialization.load_pem_private_key(text.encode(), password=None)
    except (ValueError, TypeError) as error:
        raise TLSInputError(f"{what} does not parse as a PEM private key ({error})") from error


def _public_bytes(key) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _key_type(key) -> str:
    if isinstance(key, rsa.RSAPublicKey):
        return f"RSA {key.key_size}"
    if isinstance(key, ec.EllipticCurvePublicKey):
        return f"EC {key.curve.name}"
    return type(key).__name__


def issued_by(certificate: x509.Certificate, issuer: x509.Certificate) -> bool:
    """Whether issuer's key signed certificate (names alone can match by accident)."""
    if certificate.issuer != issuer.subject:
        return False
    key = issuer.public_key()
    try:
        if isinstance(key, rsa.RSAPublicKey):
            key.verify(certificate.signature, certificate.tbs_certificate_bytes, padding.PKCS1v15(),
                       certificate.signature_hash_algorithm)
        elif isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(certificate.signature, certificate.tbs_certificate_bytes,
                       ec.ECDSA(certificate.signature_hash_algorithm))
        elif isinstance(key, (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey)):
            key.verify(certificate.signature, certificate.tbs_certificate_bytes)
        else:
            return False
    except (InvalidSignature, TypeError, ValueError):
        return False
    return True


def certificate_names(certificate: x509.Certificate) -> List[str]:
    """The DNS names and IP addresses of the subjectAltName (clients check only these, RFC 6125)."""
    try:
        san = certificate.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
    except x509.ExtensionNotFound:
        return []
    return san.get_values_for_type(x509.DNSName) + [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]


def covers(names: List[str], wanted: str) -> bool:
    """Whether a certificate with these SAN entries is valid for `wanted` (a DNS name or an IP address)."""
    try:
        address = ipaddress.ip_address(wanted)
    except ValueError:
        address = None
    if address is not None:
        return any(_same_ip(name, address) for name in names)
    wanted = wanted.lower().rstrip(".")
    for name in (n.lower().rstrip(".") for n in names):
        if name == wanted:
            return True
        # A wildcard stands for exactly one left-most label (RFC 6125 §6.4.3)
        if name.startswith("*.") and "." in wanted and wanted.split(".", 1)[1] == name[2:]:
            return True
    return False


def _same_ip(name: str, address) -> bool:
    try:
        return ipaddress.ip_address(name) == address
    except ValueError:
        return False


def _utc(moment: datetime.datetime) -> datetime.datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)


def _not_before(certificate: x509.Certificate) -> datetime.datetime:
    return _utc(getattr(certificate, "not_valid_before_utc", None) or certificate.not_valid_before)


def _not_after(certificate: x509.Certificate) -> datetime.datetime:
    return _utc(getattr(certificate, "not_valid_after_utc", None) or certificate.not_valid_after)


def check(certificate: str, private_key: str, names: List[str], min_days_valid: int,
          ca_certificate: str = "", now: Optional[datetime.datetime] = None,
          where: str = "frontdoor_tls_certificate", key_where: str = "frontdoor_tls_key",
          ca_where: str = "frontdoor_tls_ca_certificate") -> CertificateReport:
    """Every check HAProxy and the clients would make, with the operator's variable names in each message."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    chain = load_chain(certificate, where)
    leaf = chain[0]
    key = load_key(private_key, key_where)
    if _public_bytes(key.public_key()) != _public_bytes(leaf.public_key()):
        raise TLSInputError(f"{key_where} is not the key of the first certificate in {where} "
                            f"({leaf.subject.rfc4514_string()}): give the key the certificate was issued for, and the "
                            "server's certificate first in the chain")
    for position, (lower, upper) in enumerate(zip(chain, chain[1:]), start=1):
        if not issued_by(lower, upper):
            raise TLSInputError(f"{where}: certificate {position + 1} ({upper.subject.rfc4514_string()}) did not "
                                f"issue certificate {position} ({lower.subject.rfc4514_string()}): order the chain "
                                "from the server's certificate up to (not including) the root")
    if _not_before(leaf) > now:
        raise TLSInputError(f"{where} is not valid before {_not_before(leaf).isoformat()}: check the clock of the "
                            "machine that issued it, or wait")
    days_left = int((_not_after(leaf) - now).total_seconds() // 86400)
    if _not_after(leaf) <= now:
        raise TLSInputError(f"{where} expired on {_not_after(leaf).isoformat()}: renew it")
    if days_left < min_days_valid:
        raise TLSInputError(f"{where} expires on {_not_after(leaf).isoformat()}, in {days_left} days, under the "
                            f"{min_days_valid} days asked (frontdoor_tls_min_days_valid): renew it first")
    sans = certificate_names(leaf)
    for name in names:
        if not covers(sans, name):
            raise TLSInputError(f"{where} is not valid for {name!r}, the name clients use to reach the front door "
                                f"(its subjectAltName holds {sans or 'nothing'}): issue it for that name, or set "
                                "frontdoor_tls_names to the names clients use")
    if ca_certificate:
        cas = load_chain(ca_certificate, ca_where)
        top = chain[-1]
        if not any(issued_by(top, ca) or _public_bytes(top.public_key()) == _public_bytes(ca.public_key())
                   for ca in cas):
            raise TLSInputError(f"{ca_where} did not issue {where} (its last certificate, "
                                f"{top.subject.rfc4514_string()}, is issued by {top.issuer.rfc4514_string()}): "
                                "clients that trust only that CA would refuse the front door")
    return CertificateReport(
        subject=leaf.subject.rfc4514_string(), issuer=leaf.issuer.rfc4514_string(), names=sans,
        not_before=_not_before(leaf).isoformat(), not_after=_not_after(leaf).isoformat(), days_left=days_left,
        fingerprint_sha256=leaf.fingerprint(hashes.SHA256()).hex(), chain_length=len(chain),
        key_type=_key_type(leaf.public_key()))

