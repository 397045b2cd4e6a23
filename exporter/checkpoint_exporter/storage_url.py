"""Object-store URLs as watched paths (``s3://bucket/prefix``): what names one, and its parts.

The vocabulary's lowest layer, so the config file's parser, the sources and the daemon agree on
what is an object URL without importing each other."""

from __future__ import annotations

from dataclasses import dataclass

# The schemes fsspec and obstore use: S3 (and S3-compatible stores), Google Cloud Storage, and
# Azure Blob Storage (``az://container/prefix``, the account from the environment or options).
SUPPORTED_SCHEMES = ("s3", "gs", "az")


@dataclass(frozen=True)
class ObjectURL:
    scheme: str
    bucket: str
    prefix: str  # "" for the whole bucket, else ending in "/": what every key below starts with

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")


def scheme_of(path: str) -> str | None:
    """The URL scheme of ``path`` when it names object storage (one of the schemes above)."""
    scheme, separator, _ = str(path).partition("://")
    if separator and scheme in SUPPORTED_SCHEMES:
        return scheme
    return None


def is_object_url(path: object) -> bool:
    return scheme_of(str(path)) is not None


def parse_object_url(text: str) -> ObjectURL:
    """``s3://bucket/some/prefix`` as its parts; ValueError says what is wrong."""
    scheme = scheme_of(text)
    if scheme is None:
        raise ValueError(f"not an object URL: {text!r}")
    rest = text.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"{text!r} names no bucket")
    parts = [part for part in prefix.split("/") if part]
    if any(part in (".", "..") for part in parts):
        raise ValueError(f"{text!r}: '.' and '..' are not allowed in an object prefix")
    return ObjectURL(scheme, bucket, "".join(part + "/" for part in parts))
