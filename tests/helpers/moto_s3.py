"""moto's standalone S3 server on 127.0.0.1 (a free port), for the object-store tests: the real
S3 protocol over HTTP, started and stopped by the test that uses it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.helpers.servers import serving

# Test credentials: moto accepts any. Never a real key.
TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}


@dataclass(frozen=True)
class MotoServer:
    endpoint: str

    def env(self) -> dict[str, str]:
        """The standard AWS environment that points a client at this server."""
        return {**TEST_ENV, "AWS_ENDPOINT_URL": self.endpoint}

    def client(self):  # type: ignore[no-untyped-def]
        """A plain botocore client, for the test's own writes."""
        import botocore.session

        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )


@contextmanager
def moto_server() -> Iterator[MotoServer]:
    with serving(
        lambda port: [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        "/moto-api/data.json", "moto server", env={**os.environ, **TEST_ENV},
    ) as endpoint:  # fmt: skip
        yield MotoServer(endpoint)
