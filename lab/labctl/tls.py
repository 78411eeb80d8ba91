"""The lab's private CA and the front door's certificate, made with the distribution's `openssl` (docs/tls.md).

`bin/lab tls` writes STATE_DIR/tls/: ca.crt (what the lab's clients trust), ca.key, frontdoor.crt (issued by that
CA for the lb host's address, FRONTDOOR_NAME and any other address asked for: the front doors' virtual address) and
frontdoor.key. The inventory hands the two frontdoor files to
the front door role as frontdoor_tls_certificate / frontdoor_tls_key, as an operator would from a vault. A second
call keeps files that still cover every address asked for, so a Molecule converge sees the same certificate twice;
one that asks for an address the certificate lacks issues both anew.
"""
from __future__ import annotations

import ipaddress
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

from .errors import LabError
from .system import run

FRONTDOOR_NAME = "frontdoor.lab.revive"
DAYS = 30
FILES = ("ca.crt", "ca.key", "frontdoor.crt", "frontdoor.key")


def issue(tls_dir: Path, address: str, name: str = FRONTDOOR_NAME, also: Sequence[str] = ()) -> bool:
    """Make the CA and the certificate unless valid ones for `address`, the addresses `also` and `name` exist;
    True when made."""
    addresses = list(dict.fromkeys([address, *also]))
    for each in addresses:
        try:
            ipaddress.ip_address(each)
        except ValueError:
            raise LabError(f"{each!r} is not an IP address: the certificate covers addresses by their IP SAN") from None
    if _current(tls_dir, addresses, name):
        return False
    tls_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_key, ca_crt = tls_dir / "ca.key", tls_dir / "ca.crt"
    key, crt = tls_dir / "frontdoor.key", tls_dir / "frontdoor.crt"
    for path in (ca_key, key):
        run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)],
            f"making the key {path.name}")
        os.chmod(path, 0o600)
    run(["openssl", "req", "-x509", "-new", "-key", str(ca_key), "-sha256", "-days", str(DAYS), "-subj",
         "/CN=revive lab CA", "-addext", "basicConstraints=critical,CA:TRUE", "-addext",
         "keyUsage=critical,keyCertSign,cRLSign", "-out", str(ca_crt)], "making the lab CA")
    with tempfile.TemporaryDirectory() as tmp:
        csr, ext = Path(tmp) / "frontdoor.csr", Path(tmp) / "ext.cnf"
        sans = ",".join([f"DNS:{name}"] + [f"IP:{each}" for each in addresses])
        ext.write_text(f"subjectAltName={sans}\nbasicConstraints=critical,CA:FALSE\n"
                       "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                       "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
        run(["openssl", "req", "-new", "-key", str(key), "-subj", f"/CN={name}", "-out", str(csr)],
            "making the front door's certificate request")
        run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
             "-CAcreateserial", "-CAserial", str(Path(tmp) / "ca.srl"), "-days", str(DAYS), "-sha256", "-extfile",
             str(ext), "-out", str(crt)], "issuing the front door's certificate")
    return True


def _current(tls_dir: Path, addresses: Sequence[str], name: str) -> bool:
    if not all((tls_dir / f).exists() for f in FILES):
        return False
    crt = str(tls_dir / "frontdoor.crt")
    checks = [["-checkip", each] for each in addresses] + [["-checkhost", name], ["-checkend", str(7 * 86400)]]
    for check in checks:
        proc = subprocess.run(["openssl", "x509", "-noout", "-in", crt, *check], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL)
        if proc.returncode != 0 or "does NOT match" in proc.stdout:
            return False
    proc = subprocess.run(["openssl", "verify", "-CAfile", str(tls_dir / "ca.crt"), crt], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    return proc.returncode == 0


def describe(tls_dir: Path) -> str:
    if not (tls_dir / "frontdoor.crt").exists():
        raise LabError(f"no certificate in {tls_dir}")
    return run(["openssl", "x509", "-noout", "-subject", "-ext", "subjectAltName", "-enddate", "-in",
                str(tls_dir / "frontdoor.crt")], "reading the front door's certificate").strip()
