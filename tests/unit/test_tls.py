"""TLS at the front door (issue 17 §3): the certificate check (module_utils/revive_tls.py, module
tls_certificate_check) refuses what HAProxy or the clients would, naming the variable; the role's template with TLS
runs in a real HAProxy that speaks only TLS 1.2 with forward-secret AEAD ciphers and TLS 1.3, redirects plain HTTP with
a 308, and is verified by a client that trusts only the CA."""
from __future__ import annotations

import datetime
import http.client
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from fixtures.haproxy import Backend, HAProxy, free_port, render

from ansible.module_utils.revive_frontdoor import DEFAULT_PORT, DEFAULT_TLS_PORT, frontdoor_url
from ansible.module_utils.revive_haproxy import ensure, socket_sender
from ansible.module_utils.revive_tls import TLSInputError, check, covers

BIN = os.path.dirname(sys.executable)
NOW = datetime.datetime(2026, 12, 5, tzinfo=datetime.timezone.utc)
DAY = datetime.timedelta(days=1)


def pem(certificate: x509.Certificate) -> str:
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


def key_pem(key, password: bytes = b"") -> str:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption).decode()


def issue(subject: str, issuer_name: str, issuer_key, key, names=(), ips=(), ca=False, not_before=NOW - DAY,
          not_after=NOW + 90 * DAY) -> x509.Certificate:
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(not_before).not_valid_after(not_after)
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    alt = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    # Key identifiers: Python 3.13 verifies strictly (VERIFY_X509_STRICT) and wants the authority's
    builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    builder = builder.add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    if ca:
        builder = builder.add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                                        critical=True)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki():
    """A root CA, an intermediate, a server certificate for api.example.com and 127.0.0.1, an unrelated CA."""
    root_key, mid_key, leaf_key, other_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(4))
    root = issue("Root CA", "Root CA", root_key, root_key, ca=True)
    mid = issue("Intermediate CA", "Root CA", root_key, mid_key, ca=True)
    leaf = issue("api.example.com", "Intermediate CA", mid_key, leaf_key,
                 names=["api.example.com", "*.svc.example.com"], ips=["127.0.0.1"])
    other = issue("Other CA", "Other CA", other_key, other_key, ca=True)
    return {"root": root, "root_key": root_key, "mid": mid, "mid_key": mid_key, "leaf": leaf, "leaf_key": leaf_key,
            "other": other, "other_key": other_key, "chain": pem(leaf) + pem(mid), "key": key_pem(leaf_key)}


def test_a_good_chain_reports_its_names_expiry_and_key(pki):
    report = check(pki["chain"], pki["key"], ["api.example.com", "127.0.0.1", "a.svc.example.com"], 14,
                   pem(pki["root"]), now=NOW)
    assert report.names == ["api.example.com", "*.svc.example.com", "127.0.0.1"]
    assert report.days_left == 90 and report.chain_length == 2 and report.key_type == "EC secp256r1"
    assert report.subject == "CN=api.example.com" and report.issuer == "CN=Intermediate CA"


@pytest.mark.parametrize("case, needle", [
    ("garbage certificate", "frontdoor_tls_certificate holds no PEM certificate"),
    ("key of another certificate", "frontdoor_tls_key is not the key of the first certificate"),
    ("encrypted key", "frontdoor_tls_key is encrypted"),
    ("no key", "frontdoor_tls_key holds no PEM private key"),
    ("chain out of order", "frontdoor_tls_certificate is not the key"),
    ("expired", "expired on"),
    ("expires too soon", "in 5 days, under the 14 days asked"),
    ("not yet valid", "is not valid before"),
    ("name not covered", "is not valid for 'www.example.com'"),
    ("wildcard two labels deep", "is not valid for 'a.b.svc.example.com'"),
    ("IP not covered", "is not valid for '10.0.0.4'"),
    ("another CA", "frontdoor_tls_ca_certificate did not issue frontdoor_tls_certificate"),
    ("intermediate missing between", "certificate 2 (CN=Other CA) did not issue certificate 1"),
])
def test_what_haproxy_or_a_client_would_refuse_is_refused_by_name(pki, case, needle):
    chain, key, names, days, ca = pki["chain"], pki["key"], ["api.example.com"], 14, pem(pki["root"])
    if case == "garbage certificate":
        chain = "not a certificate"
    elif case == "key of another certificate":
        key = key_pem(pki["other_key"])
    elif case == "encrypted key":
        key = key_pem(pki["leaf_key"], b"secret")
    elif case == "no key":
        key = ""
    elif case == "chain out of order":
        chain = pem(pki["mid"]) + pem(pki["leaf"])
        needle = "frontdoor_tls_key is not the key of the first certificate"
    elif case == "expired":
        chain = pem(issue("api.example.com", "Intermediate CA", pki["mid_key"], pki["leaf_key"],
                          names=["api.example.com"], not_before=NOW - 90 * DAY, not_after=NOW - DAY)) + pem(pki["mid"])
    elif case == "expires too soon":
        chain = pem(issue("api.example.com", "Intermediate CA", pki["mid_key"], pki["leaf_key"],
                          names=["api.example.com"], not_after=NOW + 5 * DAY + datetime.timedelta(hours=1))) \
            + pem(pki["mid"])
    elif case == "not yet valid":
        chain = pem(issue("api.example.com", "Intermediate CA", pki["mid_key"], pki["leaf_key"],
                          names=["api.example.com"], not_before=NOW + DAY)) + pem(pki["mid"])
    elif case == "name not covered":
        names = ["www.example.com"]
    elif case == "wildcard two labels deep":
        names = ["a.b.svc.example.com"]
    elif case == "IP not covered":
        names = ["10.0.0.4"]
    elif case == "another CA":
        ca = pem(pki["other"])
    elif case == "intermediate missing between":
        chain = pem(pki["leaf"]) + pem(pki["other"])
    with pytest.raises(TLSInputError) as refused:
        check(chain, key, names, days, ca, now=NOW)
    assert needle in str(refused.value)
    assert pki["key"].splitlines()[1] not in str(refused.value)


def test_a_certificate_issued_by_the_root_itself_passes_with_that_root(pki):
    leaf = issue("lb1", "Root CA", pki["root_key"], pki["leaf_key"], ips=["10.0.0.4"])
    assert check(pem(leaf), pki["key"], ["10.0.0.4"], 0, pem(pki["root"]), now=NOW).chain_length == 1


def test_names_follow_rfc_6125():
    assert covers(["*.example.com"], "API.Example.com.")
    assert not covers(["*.example.com"], "example.com")
    assert covers(["::1"], "0:0:0:0:0:0:0:1") and not covers(["127.0.0.1"], "localhost")


def test_the_front_door_url_follows_tls_and_the_roles_defaults(repo):
    defaults = yaml.safe_load((repo / "roles/frontdoor/defaults/main.yml").read_text())
    assert (DEFAULT_PORT, DEFAULT_TLS_PORT) == (defaults["frontdoor_port"], defaults["frontdoor_tls_port"])
    assert frontdoor_url({"ansible_host": "10.0.0.4"}, "lb1") == "http://10.0.0.4:80"
    assert frontdoor_url({}, "lb1") == "http://lb1:80"
    tls = {"ansible_host": "10.0.0.4", "frontdoor_tls_certificate": "PEM", "frontdoor_name": "api.example.com"}
    assert frontdoor_url(tls, "lb1") == "https://api.example.com:443"
    assert frontdoor_url({**tls, "frontdoor_name": "fd00::4", "frontdoor_tls_port": 8443}, "lb1") == \
        "https://[fd00::4]:8443"
    # Two front doors: clients use the virtual address unless a name points at it (the role's preflight checks the
    # certificate against the same choice, roles/frontdoor/vars/main.yml __frontdoor_name; molecule/frontdoor_ha).
    vip = {**tls, "frontdoor_name": "", "frontdoor_vip": "10.0.0.250"}
    assert frontdoor_url(vip, "lb1") == "https://10.0.0.250:443"
    assert frontdoor_url({**vip, "frontdoor_name": "api.example.com"}, "lb1") == "https://api.example.com:443"


def run_module(repo, tmp_path, args: dict) -> dict:
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "check", "tls_certificate_check": args, "ignore_errors": True}]}]))
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook)],
                          cwd=repo, env=env, capture_output=True, text=True)
    assert "BEGIN PRIVATE KEY" not in proc.stdout + proc.stderr
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_the_module_checks_through_ansible_and_never_shows_the_key(repo, tmp_path, pki):
    good = run_module(repo, tmp_path, {"certificate": pki["chain"], "private_key": pki["key"],
                                       "names": ["127.0.0.1"], "ca_certificate": pem(pki["root"]),
                                       "min_days_valid": 0})
    assert not good.get("failed") and good["names"][-1] == "127.0.0.1" and not good["changed"], good
    bad = run_module(repo, tmp_path, {"certificate": pki["chain"], "private_key": key_pem(pki["other_key"]),
                                      "variable_names": {"private_key": "vault_lb_key"}})
    assert bad["failed"] and bad["msg"].startswith("vault_lb_key is not the key of the first certificate"), bad


@pytest.fixture
def tls_front(tmp_path, pki):
    backend = Backend()
    backend.release.set()   # answer at once
    plain, secure = free_port(), free_port()
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir(mode=0o700)
    (tls_dir / "frontdoor.pem").write_text(pki["chain"] + pki["key"])
    (tmp_path / "ca.pem").write_text(pem(pki["root"]))
    config = render(tmp_path, [backend], plain, frontdoor_tls_certificate=pki["chain"], frontdoor_tls_key=pki["key"],
                    frontdoor_tls_port=secure, frontdoor_tls_dir=str(tls_dir))
    proxy = HAProxy(tmp_path, config).start()
    ensure(socket_sender(proxy.socket), "vllm", ["node1-vllm-0"], "ready", check_mode=False)
    yield {"plain": plain, "secure": secure, "config": config, "ca": str(tmp_path / "ca.pem")}
    proxy.stop()
    backend.close()


def post(connection: http.client.HTTPConnection) -> http.client.HTTPResponse:
    connection.request("POST", "/v1/completions?x=1", body=b'{"prompt": "hi"}',
                       headers={"Content-Type": "application/json"})
    return connection.getresponse()


def handshake(port: int, context: ssl.SSLContext) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return f"{tls.version()} {tls.cipher()[0]}"


def test_the_front_door_serves_tls_verified_by_the_ca_and_redirects_http(tls_front):
    context = ssl.create_default_context(cafile=tls_front["ca"])
    answer = post(http.client.HTTPSConnection("127.0.0.1", tls_front["secure"], context=context, timeout=10))
    assert answer.status == 200 and answer.getheader("X-Revive-Server") == "node1-vllm-0"
    redirect = post(http.client.HTTPConnection("127.0.0.1", tls_front["plain"], timeout=10))
    assert redirect.status == 308
    assert redirect.getheader("Location") == f"https://127.0.0.1:{tls_front['secure']}/v1/completions?x=1"
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(tls_front["secure"], ssl.create_default_context())
    assert "PRIVATE KEY" not in tls_front["config"]


def test_only_tls_12_with_forward_secret_aead_and_tls_13_are_spoken(tls_front):
    port = tls_front["secure"]
    modern = ssl.create_default_context(cafile=tls_front["ca"])
    assert handshake(port, modern).startswith("TLSv1.3 ")
    tls12 = ssl.create_default_context(cafile=tls_front["ca"])
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    assert handshake(port, tls12) == "TLSv1.2 ECDHE-ECDSA-AES128-GCM-SHA256"
    for ciphers in ("ECDHE-ECDSA-AES128-SHA", "AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-SHA384"):
        weak = ssl.create_default_context(cafile=tls_front["ca"])
        weak.maximum_version = ssl.TLSVersion.TLSv1_2
        weak.set_ciphers(f"{ciphers}:@SECLEVEL=0")
        with pytest.raises(ssl.SSLError):
            handshake(port, weak)
    old = ssl.create_default_context(cafile=tls_front["ca"])
    old.set_ciphers("ALL:@SECLEVEL=0")
    old.minimum_version = ssl.TLSVersion.TLSv1
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(ssl.SSLError):
        handshake(port, old)


def test_https_only_when_http_is_off(tmp_path, pki):
    backend = Backend()
    backend.release.set()   # answer at once
    try:
        config = render(tmp_path, [backend], free_port(), frontdoor_tls_certificate=pki["chain"],
                        frontdoor_tls_key=pki["key"], frontdoor_tls_port=free_port(), frontdoor_tls_http="off")
    finally:
        backend.close()
    front = config.split("frontend vllm_front\n", 1)[1].split("\n\n", 1)[0]
    assert [line.split()[0] for line in front.splitlines() if line.strip() and not line.strip().startswith("#")] \
        == ["bind", "default_backend"] and " ssl crt " in front


def test_without_a_certificate_the_configuration_has_no_tls_at_all(tmp_path):
    backend = Backend()
    backend.release.set()   # answer at once
    try:
        config = render(tmp_path, [backend], 8080)
    finally:
        backend.close()
    assert "ssl" not in config and "redirect" not in config and "    bind 127.0.0.1:8080\n" in config


def test_an_rsa_key_works_too():
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    leaf = issue("lb1", "lb1", key, key, ips=["127.0.0.1"])
    report = check(pem(leaf), key_pem(key), ["127.0.0.1"], 0, now=NOW)
    assert report.key_type == "RSA 2048"
