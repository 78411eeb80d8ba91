"""The project's clients through a front door that terminates TLS (docs/tls.md §5): module_utils/revive_sse.py, revive
bench's client (module_utils/revive_bench/client.py, bin/revive bench --ca-file) and the lab's load client
(lab/loadgen/loadgen.py --tls --ca-file --api-key-file) verify the certificate against the operator's CA and the
host name, fail a request (never hang, never fall back to unverified) for any other certificate, refuse a bad CA
file up front naming it, and keep the API key out of argv.

A private CA, a server certificate for 127.0.0.1 it signed, one for 127.0.0.2 only, and an unrelated CA are made
with the openssl CLI; the scripted server (fake_openai.py) serves https with them."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_openai import Answer, FakeServer

from ansible.module_utils.revive_bench.client import RequestRecord, Target, build_request, request_body, stream_request
from ansible.module_utils.revive_bench.probe import ProbeError, probe
from ansible.module_utils.revive_sse import CAFileError, Endpoint, StreamRequest, stream, tls_context

REPO = Path(__file__).resolve().parents[2]
LOADGEN = REPO / "lab" / "loadgen" / "loadgen.py"
KEY = "sk-tls-test-4f1c"

OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = revive test
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
subjectAltName = IP:127.0.0.1, DNS:localhost
[elsewhere]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
subjectAltName = IP:127.0.0.2
"""
EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """{name: path}: ca.pem (the operator's CA), server.pem/.key (127.0.0.1, localhost; signed by it), elsewhere.pem/
    .key (127.0.0.2 only; signed by it), other-ca.pem (an unrelated CA)."""
    tmp = tmp_path_factory.mktemp("pki")
    (tmp / "openssl.cnf").write_text(OPENSSL_CONFIG)

    def openssl(*args):
        done = subprocess.run(["openssl", *args], cwd=tmp, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr

    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-config", "openssl.cnf", "-extensions", "ca", *EC_KEY, "-keyout", f"{ca}.key",
                "-out", f"{ca}.pem", "-days", "2", "-subj", f"/CN=revive {ca}")
    for number, leaf in enumerate(("server", "elsewhere"), start=2):
        openssl("req", "-new", "-config", "openssl.cnf", *EC_KEY, "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr",
                "-subj", f"/CN=revive {leaf}")
        openssl("x509", "-req", "-in", f"{leaf}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-set_serial", str(number),
                "-days", "2", "-extfile", "openssl.cnf", "-extensions", leaf, "-out", f"{leaf}.pem")
    return {path.name: str(path) for path in tmp.iterdir()}


def https_server(pki, leaf="server", **kwargs) -> FakeServer:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki[f"{leaf}.pem"], pki[f"{leaf}.key"])
    return FakeServer(tls=context, answer_for=lambda number, body: Answer(tokens=4), **kwargs)


def completion(max_tokens=8):
    return StreamRequest("completions", "tiny", prompt="hi", max_tokens=max_tokens)


# --- module_utils/revive_sse.py ---------------------------------------------------------------------------------

def test_sse_streams_through_https_verified_against_the_given_ca(pki):
    with https_server(pki) as fake:
        result = stream(Endpoint("127.0.0.1", fake.port, KEY, timeout=5, tls=True, ca_file=pki["ca.pem"]),
                        completion())
        headers = fake.requests[-1]["headers"]
    assert result.ok, result.error()
    assert result.text == "word0 word1 word2 word3" and result.done and result.completion_tokens == 4
    assert headers["authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("ca, trust", [("other-ca.pem", "CA file "), ("", "the system trust store")])
def test_sse_fails_a_certificate_its_ca_did_not_sign(pki, ca, trust):
    ca_file = pki[ca] if ca else ""
    with https_server(pki) as fake:
        started = time.monotonic()
        result = stream(Endpoint("127.0.0.1", fake.port, KEY, timeout=5, tls=True, ca_file=ca_file), completion())
        elapsed = time.monotonic() - started
        reached = fake.completions
    assert not result.ok and not result.truncated and result.status == 0
    assert f"TLS: the certificate of https://127.0.0.1:{fake.port} is not trusted by {trust}{ca_file}" in result.error()
    assert "unable to get local issuer certificate" in result.error()
    assert reached == 0 and elapsed < 4   # refused at the handshake: no request, no key sent, no waiting


def test_sse_checks_the_host_name_against_the_certificates_ip_sans(pki):
    """A certificate the CA signed for 127.0.0.2 is not one for 127.0.0.1: the host check stays on."""
    with https_server(pki, leaf="elsewhere") as fake:
        result = stream(Endpoint("127.0.0.1", fake.port, timeout=5, tls=True, ca_file=pki["ca.pem"]), completion())
    assert not result.ok and "IP address mismatch" in result.error(), result.error()


def test_a_bad_ca_file_is_an_error_naming_the_file(pki, tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(CAFileError, match="^CA file /nonexistent/ca.pem: No such file or directory$"):
        tls_context("/nonexistent/ca.pem")
    with pytest.raises(CAFileError, match=f"^CA file {junk}: no PEM certificate could be loaded from it"):
        tls_context(str(junk))
    # a set-up error, raised before any connection: not a failed answer
    with pytest.raises(CAFileError, match=f"^CA file {junk}:"):
        stream(Endpoint("127.0.0.1", 1, tls=True, ca_file=str(junk)), completion())
    assert tls_context(pki["ca.pem"]).verify_mode == ssl.CERT_REQUIRED and tls_context(pki["ca.pem"]).check_hostname


# --- revive bench: module_utils/revive_bench/client.py and bin/revive bench ---------------------------------------

def bench_send(port, ca_file):
    target = Target("https", "127.0.0.1", port, ca_file=ca_file)
    record = RequestRecord(index=0, level=1, target=target.label, prompt_id="p", max_tokens=8, ignore_eos=False)
    payload = build_request(target, "completions", request_body("completions", "tiny", "hi", 8, False, True), KEY)
    return asyncio.run(stream_request(target, "completions", payload, record, 5.0, 2.0, True))


def test_bench_client_verifies_the_front_door_against_the_given_ca(pki):
    with https_server(pki) as fake:
        good = bench_send(fake.port, pki["ca.pem"])
        traits = asyncio.run(probe(Target("https", "127.0.0.1", fake.port, ca_file=pki["ca.pem"]), "tiny",
                                   api_key=KEY, timeout=5))
        other = bench_send(fake.port, pki["other-ca.pem"])
        system = bench_send(fake.port, "")
        with pytest.raises(ProbeError, match="certificate verify failed"):
            asyncio.run(probe(Target("https", "127.0.0.1", fake.port, ca_file=pki["other-ca.pem"]), "tiny",
                              timeout=5))
        reached = fake.completions
    assert good.ok and good.error is None and len(good.events) == 4
    assert traits.probe_output_tokens == 4
    assert reached == 2   # the good request and the probe's: the refused ones never sent theirs
    for record, trust in ((other, f"CA file {pki['other-ca.pem']}"), (system, "the system trust store")):
        assert not record.ok and record.status == 0
        assert record.error.startswith(f"TLS: the certificate of https://127.0.0.1:{fake.port} is not trusted by "
                                       f"{trust}: "), record.error


def bench(*argv, env=None):
    return subprocess.run([sys.executable, str(REPO / "bin" / "revive"), "bench", *argv], capture_output=True,
                          text=True, timeout=60, env=env)


@pytest.mark.parametrize("url, ca_file, words", [
    ("https://127.0.0.1:1", "/nonexistent/ca.pem",
     "argument --ca-file: CA file /nonexistent/ca.pem: No such file or directory"),
    ("https://127.0.0.1:1", "{junk}", "argument --ca-file: CA file {junk}: no PEM certificate could be loaded"),
    ("http://127.0.0.1:1", "{junk}", "argument --ca-file: CA file {junk}: no PEM certificate could be loaded"),
])
def test_bench_refuses_a_bad_ca_file_naming_it(tmp_path, url, ca_file, words):
    junk = tmp_path / "junk.pem"
    junk.write_text("-----BEGIN CERTIFICATE-----\nbroken\n")
    ca_file, words = (text.format(junk=junk) for text in (ca_file, words))
    done = bench("--url", url, "--model", "m", "--out", str(tmp_path / "r"), "--ca-file", ca_file)
    assert done.returncode == 2 and words in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "r").exists()


def test_bench_runs_through_https_with_ca_file_and_fails_with_another_ca(pki, tmp_path):
    common = ["--model", "tiny", "--concurrency", "1", "--duration", "0.3", "--warmup", "0", "--max-tokens", "8"]
    env = {**os.environ, "REVIVE_API_KEY": KEY}
    with https_server(pki) as fake:
        url = f"https://127.0.0.1:{fake.port}"
        ran = bench("--url", url, *common, "--ca-file", pki["ca.pem"], "--out", str(tmp_path / "ok"), env=env)
        refused = bench("--url", url, *common, "--ca-file", pki["other-ca.pem"], "--out", str(tmp_path / "no"),
                        env=env)
        keys = {request["headers"].get("authorization") for request in fake.requests}
    assert ran.returncode in (0, 3), ran.stderr   # a 0.3 s level may be too short to judge; it must not fail
    records = [json.loads(line) for line in (tmp_path / "ok" / "requests.jsonl").read_text().splitlines()]
    assert records and all(record["ok"] for record in records)
    assert keys == {f"Bearer {KEY}"} and KEY not in (tmp_path / "ok" / "summary.json").read_text()
    assert refused.returncode == 2 and f"{url}/version: cannot connect (SSLCertVerificationError" in refused.stderr
    assert "certificate verify failed" in refused.stderr and not (tmp_path / "no").exists()


# --- lab/loadgen/loadgen.py -----------------------------------------------------------------------------------------

def loadgen(argv, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(LOADGEN), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def test_loadgen_over_tls_counts_good_answers_and_refused_certificates(pki, tmp_path):
    key_file = tmp_path / "api-key"
    key_file.write_text(f"  {KEY}\n")
    common = ["--host", "127.0.0.1", "--tls", "--api-key-file", str(key_file), "--model", "tiny",
              "--kind", "completions", "--concurrency", "2", "--max-tokens", "8", "--duration", "1.5"]
    env = {key: value for key, value in os.environ.items() if key != "REVIVE_API_KEY"}
    with https_server(pki) as fake:
        good = loadgen([*common, "--port", str(fake.port), "--ca-file", pki["ca.pem"], "--out",
                        str(tmp_path / "good.json")], env)
        bad = loadgen([*common, "--port", str(fake.port), "--ca-file", pki["other-ca.pem"], "--out",
                       str(tmp_path / "bad.json")], env)
        time.sleep(0.5)
        argv = Path(f"/proc/{good.pid}/cmdline").read_bytes().split(b"\0")
        for process in (good, bad):
            process.wait(timeout=30)
        assert good.returncode == 0 and bad.returncode == 0, good.stderr.read() + bad.stderr.read()
        keys = {request["headers"].get("authorization") for request in fake.requests}
    assert str(LOADGEN).encode() in argv and not any(KEY.encode() in arg for arg in argv)
    assert keys == {f"Bearer {KEY}"}
    summary = json.loads((tmp_path / "good.json").read_text())
    assert summary["tls"] is True and summary["ok"] > 0 and summary["failed"] == 0, summary["failures"]
    summary = json.loads((tmp_path / "bad.json").read_text())
    assert summary["ok"] == 0 and summary["failed"] > 0 and summary["truncated"] == 0
    assert {failure["error"].rsplit(": ", 1)[0] for failure in summary["failures"]} == {
        f"TLS: the certificate of https://127.0.0.1:{fake.port} is not trusted by CA file {pki['other-ca.pem']}"}


@pytest.fixture(scope="module")
def loadgen_module():
    spec = importlib.util.spec_from_file_location("loadgen_under_test", LOADGEN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_loadgen_options(loadgen_module, pki, tmp_path, monkeypatch):
    """443 with --tls and no --port; the key from --api-key-file, else $REVIVE_API_KEY."""
    monkeypatch.setenv("REVIVE_API_KEY", "from-env")
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    base = ["--host", "front.example", "--model", "m", "--duration", "1", "--out", "x"]
    args = loadgen_module.parse([*base, "--tls", "--ca-file", pki["ca.pem"], "--api-key-file", str(key_file)])
    assert (args.port, args.tls, args.ca_file, args.api_key) == (443, True, pki["ca.pem"], "from-file")
    args = loadgen_module.parse(base)
    assert (args.port, args.tls, args.api_key) == (80, False, "from-env")
    assert loadgen_module.parse([*base, "--tls", "--port", "8443"]).port == 8443


@pytest.mark.parametrize("extra, words", [
    (["--tls", "--ca-file", "/nonexistent/ca.pem"],
     "argument --ca-file: CA file /nonexistent/ca.pem: No such file or directory"),
    (["--ca-file", "{ca}"], "argument --ca-file: it verifies a TLS front door; give --tls as well"),
    (["--api-key-file", "/nonexistent/key"], "argument --api-key-file: /nonexistent/key: No such file or directory"),
    (["--api-key-file", "{empty}"], "argument --api-key-file: {empty} holds no key"),
    (["--api-key-file", "{empty}", "--api-key", "k"], "argument --api-key: not allowed with argument --api-key-file"),
])
def test_loadgen_refuses_bad_tls_and_key_options(loadgen_module, pki, tmp_path, capsys, extra, words):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    extra = [arg.format(ca=pki["ca.pem"], empty=empty) for arg in extra]
    with pytest.raises(SystemExit) as exit_:
        loadgen_module.parse(["--host", "h", "--model", "m", "--duration", "1", "--out", "x", *extra])
    assert exit_.value.code == 2 and words.format(empty=empty) in capsys.readouterr().err
