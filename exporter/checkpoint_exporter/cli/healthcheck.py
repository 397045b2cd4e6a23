"""``healthcheck``: the container's HEALTHCHECK, a probe of a running serve's /healthz."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from checkpoint_exporter.cli import serve
from checkpoint_exporter.cli.common import EXIT_FAILURE, EXIT_OK, report_config_error

# Below the Dockerfile's HEALTHCHECK --timeout, so the probe says why it failed before the
# engine kills it.
HEALTHCHECK_TIMEOUT_SECONDS = 3.0


HELP = (
    "probe a running serve's /healthz where its flags and config file say it listens, over "
    "TLS when its web config turns TLS on; exit 0 healthy, 1 not (a container HEALTHCHECK)"
)
DESCRIPTION = (
    HELP + ". Takes serve's flags, so it can be given serve's very command line; it reads only "
    "the web ones (--config.file's web: block, --web.listen-address, --web.config.file)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    serve.add_arguments(parser)
    probe = parser.add_argument_group("probe")
    probe.add_argument(
        "--probe.timeout",
        dest="probe_timeout",
        type=float,
        default=HEALTHCHECK_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help=f"give up after this long (default {HEALTHCHECK_TIMEOUT_SECONDS:g})",
    )
    probe.add_argument(
        "--probe.cert-file",
        dest="probe_cert_file",
        metavar="FILE",
        help="a client certificate (PEM) to present, for a web config that requires one "
        "(client_auth_type: RequireAndVerifyClientCert)",
    )
    probe.add_argument(
        "--probe.key-file", dest="probe_key_file", metavar="FILE", help="its private key"
    )


def run(args: argparse.Namespace) -> int:
    """GET /healthz of the serve these flags describe; every failure is exit 1 (Docker reserves
    2). The certificate is not verified: the probe connects to the address serve itself listens
    on, on this host, to learn whether it is alive (a certificate naming 127.0.0.1 is rare, and
    its CA need not be in the image)."""
    import ssl
    import urllib.error
    import urllib.request

    from checkpoint_exporter.config import ConfigError

    try:
        url, tls = _healthcheck_target(args)
        context = None
        if tls is not None:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            if args.probe_cert_file:
                context.load_cert_chain(args.probe_cert_file, args.probe_key_file)
    except ConfigError as error:
        report_config_error(error)
        return EXIT_FAILURE
    except (OSError, ValueError) as error:
        print(f"healthcheck: {error}", file=sys.stderr)
        return EXIT_FAILURE
    try:
        with urllib.request.urlopen(url, timeout=args.probe_timeout, context=context) as answer:
            body = answer.read(256).decode(errors="replace").strip()
    except urllib.error.HTTPError as error:
        reason = error.read(256).decode(errors="replace").strip()
        print(f"healthcheck: {url}: {error.code} {reason}", file=sys.stderr)
        return EXIT_FAILURE
    except (OSError, ValueError) as error:  # refused, timed out, the handshake refused
        hint = ""
        if tls is not None and tls.verify_mode == ssl.CERT_REQUIRED and not args.probe_cert_file:
            hint = " (the web config requires a client certificate: give --probe.cert-file)"
        print(f"healthcheck: {url}: {getattr(error, 'reason', error)}{hint}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"{url}: {body}")
    return EXIT_OK


def _healthcheck_target(args: argparse.Namespace) -> tuple[str, Any]:
    """(the /healthz URL, the server's TLS context or None), resolved as serve resolves its
    listen address and web config: the flags over the config file's web: block."""
    from checkpoint_exporter.config import WebConfig, load_web_section, parse_listen_address
    from checkpoint_exporter.webconfig import load_web_config

    if bool(args.probe_cert_file) != bool(args.probe_key_file):
        raise ValueError("--probe.cert-file and --probe.key-file go together")
    web = load_web_section(args.config_file) if args.config_file else WebConfig()
    address = parse_listen_address(args.listen_address or web.listen_address)
    security_file = args.web_config_file or web.config_file
    tls = load_web_config(Path(security_file)).tls if security_file else None
    # Every interface ("", 0.0.0.0, ::) includes loopback; a named host is where serve bound.
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(address.host, address.host)
    host = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{host}:{address.port}/healthz", tls
