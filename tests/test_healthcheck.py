"""`checkpoint-exporter healthcheck` (the image's HEALTHCHECK) against a running serve: plain
HTTP, TLS with a certificate the probe cannot verify, mutual TLS; where it looks (the flags over
the config file's web: block) and what it ignores (the rest of the file)."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import Exporter, run_cli, write_config
from tests.exposition.test_web_security import Pki, pki  # noqa: F401  (the certificates, a fixture)
from tests.helpers.alerting import free_port

pytestmark = [pytest.mark.daemon]


def _port(exporter: Exporter) -> int:
    return int(exporter.base.rsplit(":", 1)[1])


def test_plain_http_from_the_flags(exporter) -> None:
    running = exporter()
    result = run_cli("healthcheck", "--web.listen-address", f"127.0.0.1:{_port(running)}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"http://127.0.0.1:{_port(running)}/healthz: ok\n"


def test_every_interface_is_probed_on_loopback(exporter, tmp_path: Path) -> None:
    """serve's default listens on every interface (":25780"): the probe asks 127.0.0.1."""
    port = free_port()
    running = exporter("--web.listen-address", f":{port}")
    result = run_cli("healthcheck", "--web.listen-address", f":{port}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"http://127.0.0.1:{port}/healthz")
    running.stop()
    down = run_cli("healthcheck", "--web.listen-address", f":{port}")
    assert down.returncode == 1 and "refused" in down.stderr, down.stderr


def test_tls_from_the_config_file(exporter, tmp_path: Path, pki: Pki) -> None:  # noqa: F811
    """TLS turned on in the config file's web: block, with a certificate signed by a CA the
    probe does not have: healthy, where a plain-HTTP probe (the image's HEALTHCHECK before
    this command) fails. The rest of the file is not read, so a mistake in a job (which the
    running serve outlives, keeping its configuration) does not fail the probe either."""
    tls = f"tls_server_config: {{cert_file: {pki.server_cert}, key_file: {pki.server_key}}}\n"
    web = write_config(tmp_path, tls, "web.yaml")
    running = exporter("--web.config.file", str(web))
    assert running.base.startswith("https://")
    config = write_config(tmp_path, f"""
web: {{listen_address: "127.0.0.1:{_port(running)}", config_file: web.yaml}}
jobs: [{{name: "not a job name", path: /nowhere}}]
""")  # fmt: skip
    result = run_cli("healthcheck", "--config.file", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"https://127.0.0.1:{_port(running)}/healthz: ok\n"

    with pytest.raises(OSError):  # reset, or refused as not TLS
        urllib.request.urlopen(f"http://127.0.0.1:{_port(running)}/healthz", timeout=5)
    # Nor would verifying the certificate get in: its CA is the test's own.
    with pytest.raises(urllib.error.URLError) as refused:
        urllib.request.urlopen(running.base + "/healthz", timeout=5)
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)


def test_the_flags_override_the_config_file(exporter, tmp_path: Path) -> None:
    running = exporter()
    config = write_config(tmp_path, 'web: {listen_address: "127.0.0.1:1"}\n')
    wrong = run_cli("healthcheck", "--config.file", str(config))
    assert wrong.returncode == 1 and "127.0.0.1:1/healthz" in wrong.stderr
    right = run_cli(
        "healthcheck", "--config.file", str(config),
        "--web.listen-address", f"127.0.0.1:{_port(running)}",
    )  # fmt: skip
    assert right.returncode == 0, right.stderr


def test_mutual_tls_needs_the_probe_given_a_client_certificate(
    exporter,
    tmp_path: Path,
    pki: Pki,  # noqa: F811
) -> None:
    web = write_config(tmp_path, f"""
tls_server_config:
  cert_file: {pki.server_cert}
  key_file: {pki.server_key}
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {pki.ca}
""", "web.yaml")  # fmt: skip
    running = exporter("--web.config.file", str(web))
    flags = ["--web.listen-address", f"127.0.0.1:{_port(running)}", "--web.config.file", str(web)]
    without = run_cli("healthcheck", *flags)
    assert without.returncode == 1
    assert "requires a client certificate: give --probe.cert-file" in without.stderr
    rogue = run_cli("healthcheck", *flags, "--probe.cert-file", str(pki.rogue_cert),
                    "--probe.key-file", str(pki.rogue_key))  # fmt: skip
    assert rogue.returncode == 1
    given = run_cli("healthcheck", *flags, "--probe.cert-file", str(pki.client_cert),
                    "--probe.key-file", str(pki.client_key))  # fmt: skip
    assert given.returncode == 0, given.stderr


def test_what_it_cannot_read_is_unhealthy_with_the_reason(tmp_path: Path) -> None:
    """Exit 1 for every failure, never 2 (Docker reserves it), naming the file and key."""
    config = write_config(tmp_path, "web: {listen_address: nowhere, config_file: missing.yaml}\n")
    result = run_cli("healthcheck", "--config.file", str(config))
    assert result.returncode == 1
    assert "web.listen_address" in result.stderr and "web.config_file" in result.stderr
    assert str(config) in result.stderr
    missing = run_cli("healthcheck", "--config.file", str(tmp_path / "absent.yaml"))
    assert missing.returncode == 1 and "absent.yaml" in missing.stderr
    half = run_cli("healthcheck", "--probe.cert-file", str(config))
    assert half.returncode == 1 and "go together" in half.stderr
