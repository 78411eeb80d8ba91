"""The lab's private CA and front-door certificate (lab/labctl/tls.py, `bin/lab tls`), made with the real openssl:
which addresses and name the certificate covers, that the CA verifies it, that a second call keeps it and that one
asking for an address it lacks (a front doors' virtual address) issues it anew."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab"))

from labctl import tls  # noqa: E402
from labctl.errors import LabError  # noqa: E402


def sans(tls_dir: Path) -> set:
    """The certificate's subjectAltName entries: ("DNS", name) and ("IP", address)."""
    cert = x509.load_pem_x509_certificate((tls_dir / "frontdoor.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return ({("DNS", n) for n in names.get_values_for_type(x509.DNSName)}
            | {("IP", str(a)) for a in names.get_values_for_type(x509.IPAddress)})


def verifies(tls_dir: Path) -> bool:
    done = subprocess.run(["openssl", "verify", "-CAfile", str(tls_dir / "ca.crt"), str(tls_dir / "frontdoor.crt")],
                          capture_output=True, text=True, check=False)
    return done.returncode == 0


def test_the_certificate_covers_the_host_the_name_and_the_addresses_asked_for(tmp_path):
    out = tmp_path / "tls"
    assert tls.issue(out, "10.213.0.4", also=["10.213.0.250"]) is True
    assert sans(out) == {("DNS", tls.FRONTDOOR_NAME), ("IP", "10.213.0.4"), ("IP", "10.213.0.250")}
    assert verifies(out)
    assert (out / "frontdoor.key").stat().st_mode & 0o777 == 0o600
    assert (out / "ca.key").stat().st_mode & 0o777 == 0o600


def test_a_second_call_keeps_a_certificate_that_covers_what_it_asks_for(tmp_path):
    out = tmp_path / "tls"
    tls.issue(out, "10.213.0.4", also=["10.213.0.250"])
    before = (out / "frontdoor.crt").read_bytes()
    assert tls.issue(out, "10.213.0.4") is False                          # a subset: kept
    assert tls.issue(out, "10.213.0.4", also=["10.213.0.250"]) is False   # the same: kept
    assert (out / "frontdoor.crt").read_bytes() == before


def test_an_address_the_certificate_lacks_issues_ca_and_certificate_anew(tmp_path):
    out = tmp_path / "tls"
    tls.issue(out, "10.213.0.4")
    ca_before = (out / "ca.crt").read_bytes()
    assert ("IP", "10.213.0.250") not in sans(out)
    assert tls.issue(out, "10.213.0.4", also=["10.213.0.250"]) is True
    assert ("IP", "10.213.0.250") in sans(out)
    assert (out / "ca.crt").read_bytes() != ca_before
    assert verifies(out)


@pytest.mark.parametrize("bad", ["frontdoor.lab.revive", "10.213.0.250/24", ""])
def test_an_address_that_is_not_one_is_refused_before_anything_is_written(tmp_path, bad):
    out = tmp_path / "tls"
    with pytest.raises(LabError, match="not an IP address"):
        tls.issue(out, "10.213.0.4", also=[bad])
    assert not out.exists()
