"""YAML -> typed config: the exporter's configuration, its key tables, and the resolved view
that check-config prints.

The keys are checked by the shared schema helper (schema.py): every problem in a file is reported
at once, each naming the file, the line, the key path and the reason, so one edit-and-check cycle
fixes them all.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import pwd
import re
import stat
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from checkpoint_exporter.schema import (
    ConfigError,
    ConfigProblem,
    Field,
    KeyPath,
    Parser,
    Problems,
    boolean,
    choice,
    format_key,
    fraction,
    positive_duration,
    rate,
    read_config_text,
    read_yaml,
    regex,
    shown,
    text,
    type_name,
    whole_number,
)

# "X as X": the other readers and the CLI import these from here too.
from checkpoint_exporter.schema import YamlDocument as YamlDocument
from checkpoint_exporter.schema import did_you_mean as did_you_mean
from checkpoint_exporter.schema import read_yaml_file as read_yaml_file
from checkpoint_exporter.storage_url import (
    is_object_url,
    parse_object_url,
    scheme_of,
)
from checkpoint_exporter.units import format_duration

log = logging.getLogger(__name__)

# Outside the crowded 9100-9999 exporter allocations, and clear of the neighbours on a GPU node:
# node_exporter 9100, dcgm-exporter 9400, OpenTelemetry 9464, kubelet 10250-10259, Thanos 10901/2.
DEFAULT_PORT = 25780
DEFAULT_LISTEN_ADDRESS = f":{DEFAULT_PORT}"

LAYOUTS = (
    "auto", "dcp", "torchtitan", "megatron", "nemo", "deepspeed", "accelerate", "hf", "lightning",
    "orbax", "ray", "torchsave",
)  # fmt: skip
WATCH_MODES = ("auto", "inotify", "poll")
GPU_MODES = ("auto", "on", "off")
# Scopes (DESIGN "Scopes and sharding"): a node path is seen by this node alone (local staging,
# the spool, telemetry), a shared one by every node (a network or parallel filesystem).
NODE, SHARED = "node", "shared"
SCOPE_CHOICES = ("auto", NODE, SHARED)

# A job name is a label value and the name of the job's spool directory.
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


# The shortest default abort_after: a save that wrote nothing for ten minutes is not coming back,
# while a slow commit (a metadata gather, a rename on a busy server) may pause for minutes.
MIN_ABORT_AFTER = 600.0

# --- values -------------------------------------------------------------------------------


def parse_listen_address(text: str) -> ListenAddress:
    """``:25780``, ``0.0.0.0:25780``, ``[::1]:25780`` or ``localhost:25780``."""
    if not isinstance(text, str):
        raise ValueError(f"expected host:port, got {type(text).__name__}")
    match = re.fullmatch(r"(?:\[([0-9A-Fa-f:.%\w]+)\]|([^:\[\]]*)):(\d{1,5})", text.strip())
    if match is None:
        raise ValueError(f"invalid listen address {text!r}: expected host:port, e.g. :25780")
    host = match.group(1) if match.group(1) is not None else match.group(2)
    if any(c.isspace() or not c.isprintable() for c in host):
        raise ValueError(
            f"invalid listen address {text!r}: the host contains a space or control character"
        )
    port = int(match.group(3))
    if port > 65535:
        raise ValueError(f"invalid listen address {text!r}: port {port} is above 65535")
    return ListenAddress(host, port)


# Upper bounds of counts and rates. Each value ends up in a float (a gauge, a token bucket) or
# sizes something (a ring buffer, a recursion): past these it overflows, runs out of memory or
# out of stack at run time, so it is refused when the file is loaded instead.
MAX_COUNT = 1_000_000
MAX_SCAN_DEPTH = 64  # the listing recurses once per level
MAX_OPS_PER_SECOND = 1e9  # metadata operations: far beyond any filesystem; 0 means no limit
MAX_BYTES_PER_SECOND = 1e13  # 10 TB/s: far beyond any disk; 0 means no limit
MAX_RING_SAMPLES = 100_000  # telemetry.retention / telemetry.sample_interval: 1.6 MB a series


def _telemetry_path(value: object) -> str:
    path = text(value)
    if not path.startswith("/"):
        raise ValueError(f"must start with '/', got {shown(path)}")
    if any(c.isspace() or not c.isprintable() or c in "?#" for c in path):
        raise ValueError(
            f"must be a plain URL path (no spaces, control characters, '?' or '#'), "
            f"got {shown(path)}"
        )
    return path


def _job_name(value: object) -> str:
    name = text(value)
    if not JOB_NAME.fullmatch(name):
        raise ValueError(
            f"invalid job name {name!r}: use letters, digits, '.', '_' and '-' (at most 128, "
            "starting with a letter or digit); it becomes a label value and a spool directory name"
        )
    return name


MAX_UID = 2**32 - 2  # (uid_t) -1 is no user


def _spool_owner(value: object) -> tuple[int, ...]:
    """A uid or a user name, or a list of them."""
    return tuple(sorted({_uid(item) for item in (value if isinstance(value, list) else [value])}))


def _uid(value: object) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, str) and value:
        try:
            return pwd.getpwnam(value).pw_uid
        except (KeyError, ValueError):
            raise ValueError(f"no user {shown(value)} on this machine: give its uid") from None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_UID:
        raise ValueError(
            f"expected a uid (0 to {MAX_UID}) or a user name, or a list of them, got "
            f"{type_name(value)} {shown(value)}"
        )
    return value


def _listen_address(value: object) -> str:
    parse_listen_address(value)  # type: ignore[arg-type]
    return str(value)


def _path_parser(base_dir: Path) -> Parser:
    """Paths in the file; a relative one is relative to ``base_dir`` (the file's directory)."""

    def parse(value: object) -> Path:
        path_text = text(value)
        # No file name can hold NUL, and every system call refuses it: say so here rather than
        # let os.stat raise at start-up.
        if "\0" in path_text:
            raise ValueError(f"a path cannot contain a NUL character, got {shown(path_text)}")
        try:
            path = Path(path_text).expanduser()
        except RuntimeError as error:  # "~" without a home directory
            raise ValueError(f"cannot expand {shown(path_text)}: {error}") from None
        return path if path.is_absolute() else base_dir / path

    return parse


# Object URLs are polled, and every poll is billed: a slower default than a filesystem's.
OBJECT_POLL_INTERVAL = 30.0


# What a job's ``storage_options:`` may say: where and how to connect, never who it is. Secrets
# come only from the standard environment (or a file it names), so the file can be shared.
def _endpoint_url(value: object) -> str:
    """An http(s) URL with nothing secret in it: it names the store's worker in logs and labels."""
    url = text(value)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError(
            "must not carry credentials or a query (it is shown in logs and metric labels); "
            "credentials come from the environment"
        )
    return url


def _account_name(value: object) -> str:
    """An Azure storage account's name (3-24 lower-case letters and digits), not its key."""
    name = text(value)
    if not re.fullmatch(r"[a-z0-9]{3,24}", name):
        raise ValueError(f"expected 3 to 24 lower-case letters and digits, got {shown(value)}")
    return name


STORAGE_OPTIONS = {
    "endpoint_url": _endpoint_url,
    "region": text,
    "allow_http": boolean,
    "addressing_style": choice(("auto", "path", "virtual")),
    "account_name": _account_name,
}
# The options that mean something to one kind of store only.
SCHEME_OPTIONS = {"region": "s3", "addressing_style": "s3", "account_name": "az"}
_SECRET_LIKE = re.compile(
    r"secret|passw|token|credential|access_key|key_id|private|sas|connection_string|account_key",
    re.IGNORECASE,
)


def _object_or_path(path: Parser) -> Parser:
    """A job's ``path`` or ``staging``: an object URL (kept as its normalized text), or a path."""

    def parse(value: object) -> Path | str:
        candidate = text(value)
        if scheme_of(candidate) is not None:
            return str(parse_object_url(candidate))
        return path(value)

    return parse


def _storage_options(value: object) -> tuple[tuple[str, object], ...]:
    """How to reach a job's object store; a key that looks like a secret is refused."""
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping, got {type_name(value)}")
    options: list[tuple[str, object]] = []
    for key, option in value.items():
        name = str(key)
        if _SECRET_LIKE.search(name):
            raise ValueError(
                f"{name} looks like a secret: credentials come only from the environment "
                "(AWS_*, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*, workload identity), "
                "never from this file"
            )
        parse = STORAGE_OPTIONS.get(name)
        if parse is None:
            raise ValueError(
                f"unknown storage option {name!r}{did_you_mean(name, STORAGE_OPTIONS)}; "
                f"expected one of {', '.join(STORAGE_OPTIONS)}"
            )
        try:
            options.append((name, parse(option)))
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None
    return tuple(options)


def _optional(parse: Parser) -> Parser:
    return lambda value: None if value is None else parse(value)


def _share(value: object) -> float:
    """A share of a save's time or of a baseline, in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"expected a number above 0 and at most 1, got {shown(value)}")
    if not 0 < value <= 1:
        raise ValueError(f"must be above 0 and at most 1, got {shown(value)}")
    return float(value)


def _growth(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"expected a number of at least 1, got {shown(value)}")
    if not 1 <= value <= 1000:
        raise ValueError(f"must be at least 1 and at most 1000 (a ratio), got {shown(value)}")
    return float(value)


# --- one declaration per key ------------------------------------------------------------------
#
# Each mapping of the file is a frozen dataclass, and each of its fields that is a key of the
# file says so in its metadata (``_key`` and the shorthands below): how the file's value is
# parsed, whether the key is required, how check-config prints it. The schema helper's table
# (``key_fields``) and check-config's resolved view (``dumped``) are both read from the fields,
# so a key is declared once: add a field with its metadata, and it is accepted and printed.


def _as_given(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class _Key:
    """What the metadata of a dataclass field that is a config key says about it."""

    parse: Parser | None  # None: taken as it is (a section or list parsed on its own)
    required: bool = False
    path: bool = False  # a path, relative to the file's directory: parsed per file
    optional: bool = False  # (a path) null is allowed and means none
    dump: Callable[[Any], Any] = _as_given  # its value as check-config prints it
    shown: str | None = None  # the attribute printed instead of the field (a resolved value)
    inline: type | None = None  # a dataclass whose keys sit in this mapping (a job's policy)


_KEY = "config_key"  # the metadata entry that holds a field's _Key
Metadata = dict[str, _Key]


def _key(
    parse: Parser, *, required: bool = False, dump: Callable[[Any], Any] = _as_given
) -> Metadata:
    """A key whose value ``parse`` reads, printed by ``dump``."""
    return {_KEY: _Key(parse, required, dump=dump)}


def _optional_duration(value: float | None) -> str | None:
    return None if value is None else format_duration(value)


def _duration(*, optional: bool = False, shown: str | None = None) -> Metadata:
    """A duration (``90s``, ``15m``); ``optional``: null is allowed and means none."""
    if optional:
        return {_KEY: _Key(_optional(positive_duration), dump=_optional_duration, shown=shown)}
    return {_KEY: _Key(positive_duration, dump=format_duration, shown=shown)}


def _optional_path(value: Path | None) -> str | None:
    return str(value) if value else None


def _path(*, required: bool = False, optional: bool = False) -> Metadata:
    """A path; a relative one is relative to the file's directory, so it is parsed per file."""
    dump = _optional_path if optional else str
    return {_KEY: _Key(None, required, path=True, optional=optional, dump=dump)}


def _section() -> Metadata:
    """A mapping of its own (``web:``, ``telemetry:``), read with its dataclass' table."""
    return {_KEY: _Key(None, dump=dumped)}


def _entries() -> Metadata:
    """A list of mappings (``jobs:``, ``discover:``), each read with its dataclass' table."""
    return {_KEY: _Key(None, dump=lambda entries: [dumped(entry) for entry in entries])}


def _inline(cls: type) -> Metadata:
    """A dataclass whose keys are stated in this mapping itself (a job's policy)."""
    return {_KEY: _Key(None, inline=cls)}


def _keys_of(cls: type) -> list[tuple[str, _Key]]:
    """(key, its declaration) for each field of dataclass ``cls`` that is a config key."""
    return [(f.name, f.metadata[_KEY]) for f in fields(cls) if _KEY in f.metadata]


def key_fields(cls: type, path: Parser | None = None) -> tuple[Field, ...]:
    """The schema helper's table of ``cls``'s keys; ``path`` parses the file's paths (relative
    to its directory). An inline dataclass' keys follow the field that holds it."""
    table: list[Field] = []
    for name, spec in _keys_of(cls):
        if spec.inline is not None:
            table.extend(key_fields(spec.inline, path))
            continue
        parse = spec.parse or _as_given
        if spec.path:
            if path is None:
                raise TypeError(f"{cls.__name__}.{name} is a path: give the file's path parser")
            parse = _optional(path) if spec.optional else path
        table.append(Field(name, parse, spec.required))
    return tuple(table)


def key_names(cls: type) -> frozenset[str]:
    """The keys of ``cls``'s mapping, inline ones included."""
    return frozenset(f.key for f in key_fields(cls, path=_as_given))


def _values_of(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The parsed ``values`` that are ``cls``'s own keys and not sections or lists: what
    constructs it over its dataclass defaults."""
    return {
        name: values[name]
        for name, spec in _keys_of(cls)
        if name in values and (spec.parse is not None or spec.path)
    }


def dumped(value: Any) -> dict[str, Any]:
    """Every key of dataclass ``value``, in field order, as check-config prints it."""
    out: dict[str, Any] = {}
    for name, spec in _keys_of(type(value)):
        if spec.inline is not None:
            out.update(dumped(getattr(value, name)))
        else:
            out[name] = spec.dump(getattr(value, spec.shown or name))
    return out


@dataclass(frozen=True)
class Policy:
    """The objectives and knobs a job inherits from ``defaults`` and may override."""

    interval: float = field(default=15 * 60.0, metadata=_duration())
    deadline: float = field(default=60.0, metadata=_duration())
    retained_generations: int = field(default=3, metadata=_key(whole_number(1, MAX_COUNT)))
    capacity_reserve: float = field(default=0.20, metadata=_key(fraction))
    restore_drill_max_age: float = field(default=7 * 86400.0, metadata=_duration())
    layout: str = field(default="auto", metadata=_key(choice(LAYOUTS)))
    watch: str = field(default="auto", metadata=_key(choice(WATCH_MODES)))
    # Rescan period when polling (network filesystems)
    poll_interval: float = field(default=5.0, metadata=_duration())
    # Megatron integrity.json sha256, read at a capped rate
    verify_checksums: bool = field(default=False, metadata=_key(boolean))
    # How long a generation with no commit marker (a single-file checkpoint, DeepSpeed without
    # `latest`) must stay unchanged before it is judged: long enough that a copy or a slow
    # writer between two chunks is not taken for finished, short next to any deadline.
    settle: float = field(default=5.0, metadata=_duration())
    # The scope of the job's durable tier (``path``): auto decides from its mount. A staging
    # tier is always scoped from its mount (it is node-local storage, or a shared fast tier).
    scope: str = field(default="auto", metadata=_key(choice(SCOPE_CHOICES)))
    # Mean time between failures that stop the job (a restart from the newest checkpoint): the
    # input of Young's and Daly's intervals. None: not stated, no interval advice.
    mtbf: float | None = field(default=None, metadata=_duration(optional=True))
    # A job with no sign of life (heartbeat, spool event, write in its tree) for this long is
    # presumed gone: its checkpoints stop paging, and a ticket names it.
    abandon_after: float = field(default=86400.0, metadata=_duration())
    # A save in progress with nothing moved for this long is aborted (None: twice the deadline,
    # at least MIN_ABORT_AFTER). Slower than the deadline is late, not aborted: a slow commit
    # writes nothing for a while, then commits.
    abort_after: float | None = field(
        default=None, metadata=_duration(optional=True, shown="abort_seconds")
    )
    # The job ended (a job that is not instrumented cannot say so itself): nothing pages for it.
    finished: bool = field(default=False, metadata=_key(boolean))
    # Whether its failures page (critical) or open tickets (warning). Resolved when the file is
    # read: a configured job pages; a discovered one pages only where its objectives (interval
    # and deadline) were stated, in its discover entry or in `defaults:`.
    page: bool = field(default=True, metadata=_key(boolean))
    # The uids whose spool directories are the job's (a tenant may make another job's first);
    # () leaves it to the owner of the job's checkpoint tree (see sources/spool.py).
    spool_owner: tuple[int, ...] = field(default=(), metadata=_key(_spool_owner, dump=list))

    @property
    def abort_seconds(self) -> float:
        """Seconds without progress after which a save in progress is aborted."""
        if self.abort_after is not None:
            return self.abort_after
        return max(2 * self.deadline, MIN_ABORT_AFTER)


@dataclass(frozen=True)
class ScanConfig:
    """How hard the scanner may work shared storage."""

    # On network filesystems; 0 = no limit
    metadata_ops_per_second: float = field(default=10_000, metadata=_key(rate(MAX_OPS_PER_SECOND)))
    # Full relisting, also after an inotify overflow
    reconcile_interval: float = field(default=3600.0, metadata=_duration())
    max_depth: int = field(default=8, metadata=_key(whole_number(1, MAX_SCAN_DEPTH)))
    checksum_bytes_per_second: float = field(
        default=200e6, metadata=_key(rate(MAX_BYTES_PER_SECOND))
    )
    # Address space of the worker that parses DCP .metadata (see dcp_metadata.IsolatedParser):
    # a real file needs up to about 16 times its size, so 768 MiB checks files up to ~40 MiB.
    # The pod's memory limit must leave this much beside the daemon.
    metadata_memory_bytes: int = field(
        default=768 * 1024 * 1024, metadata=_key(whole_number(64 << 20, 1 << 40))
    )


@dataclass(frozen=True)
class JobConfig:
    name: str = field(metadata=_key(_job_name, required=True))
    path: Path = field(metadata=_path(required=True))
    staging: Path | None = field(default=None, metadata=_path(optional=True))
    policy: Policy = field(default_factory=Policy, metadata=_inline(Policy))
    # An object URL's connection (README, "Object storage"); no secrets.
    storage_options: tuple[tuple[str, object], ...] = field(
        default=(), metadata=_key(_storage_options, dump=dict)
    )


@dataclass(frozen=True)
class DiscoverConfig:
    root: Path = field(metadata=_path(required=True))  # or an object URL's text
    max_jobs: int = field(default=200, metadata=_key(whole_number(1, MAX_COUNT)))
    forget_after: float = field(default=86400.0, metadata=_duration())
    policy: Policy = field(default_factory=Policy, metadata=_inline(Policy))
    # An object-store root's connection, given to every job found under it; no secrets.
    storage_options: tuple[tuple[str, object], ...] = field(
        default=(), metadata=_key(_storage_options, dump=dict)
    )


@dataclass(frozen=True)
class ListenAddress:
    host: str  # "" means every interface
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class WebConfig:
    listen_address: str = field(default=DEFAULT_LISTEN_ADDRESS, metadata=_key(_listen_address))
    telemetry_path: str = field(default="/metrics", metadata=_key(_telemetry_path))
    config_file: Path | None = field(default=None, metadata=_path(optional=True))


@dataclass(frozen=True)
class PathsConfig:
    procfs: Path = field(default=Path("/proc"), metadata=_path())
    sysfs: Path = field(default=Path("/sys"), metadata=_path())
    # Accepted from 0.1 configs and flags; nothing reads it
    rootfs: Path = field(default=Path("/"), metadata=_path())


@dataclass(frozen=True)
class TelemetryConfig:
    sample_interval: float = field(default=1.0, metadata=_duration())
    network_devices: str = field(default="^(eth|en|ib|mlx|bond)", metadata=_key(regex))
    infiniband: bool = field(default=True, metadata=_key(boolean))
    gpu: str = field(default="auto", metadata=_key(choice(GPU_MODES)))
    # How far back samples are kept: the longest save to correlate
    retention: float = field(default=3600.0, metadata=_duration())


@dataclass(frozen=True)
class DiagnosisThresholds:
    """When a finished save is diagnosed with a symptom of the seed article's bottleneck matrix
    (section 7; core/diagnosis.py applies them, docs/runbooks.md argues them per symptom).

    Every share has an absolute floor beside it, so a one-second save's noise (thread start-up,
    a scheduler tick) never reads as a bottleneck, and a clean save -- phases in proportion,
    ranks within a fraction of a second, no neighbour, GPUs as busy as before -- has none.

    - ``straggler_share`` / ``straggler_seconds``: the spread of the local ranks' write ends is
      over 25 % of the save's total and over 1 s. Ranks of one balanced save finish within a
      few percent of each other; a quarter of the save spent waiting for one rank is the
      matrix's "one server finishes much later".
    - ``commit_share`` / ``commit_seconds``: the final completion after the last rank's payload
      write (commit marker, metadata, rename) takes over half the total and over 1 s: more time
      finishing than moving bytes is "fast payload write, slow final completion".
    - ``staging_share`` / ``staging_seconds``: training was held before any payload moved (the
      shorter of the pause and the staging phase) for over half the total and over 1 s; when
      network telemetry saw traffic in the window, at most ``staging_network_share`` (25 %) of
      it came during that stall ("the pause passes before network traffic rises"). A
      synchronous save (resume not before written) holds training through its write by design:
      its stall is the staging phase alone, and only network evidence can say it was staging.
    - ``contention_deadline_share``: the save took over 80 % of its deadline while another
      job's save overlapped it, no local cause (straggler, commit, staging) explains it, and the
      job's recent saves without an overlapping neighbour stayed under that share (their
      median): "single job is fast, several jobs miss the window". 80 % is the margin an
      operator is told to keep; a save that only overlaps is not a symptom.
    - ``backlog_saves`` / ``backlog_growth`` / ``backlog_in_flight``: the last 3 saves each took
      longer than the one before, the newest at least 1.5 times the oldest of them, and at least
      one more generation was still in flight (in progress, or committed on staging and not yet
      drained) when this one ended: "async saves become progressively slower". Waiting staged
      generations count only where both tiers are read (a process reading staging alone cannot
      tell a retained, drained generation from one waiting). ``backlog_seconds``: and the newest
      took over 1 s longer than the oldest of them, so sub-second jitter of short saves that
      happens to rise three times running is not a backlog.
    - ``gpu_share`` / ``gpu_baseline``: mean GPU utilisation in the window under half its
      baseline just before the save, when that baseline was at least 20 % (an idle GPU cannot
      be disturbed): "training slows only during storage writes". The pause (GPUs idle by
      design) is discounted: the bound on the time after the resume, mean x window / (window -
      pause), must be under it, and a pause of half the window or more is not judged.
    - ``telemetry_grace``: how long after a save's end its diagnosis waits for the window's
      telemetry (the sampler correlates it 1.5 samples after the end) before it is made without.
    """

    straggler_share: float = field(default=0.25, metadata=_key(_share))
    straggler_seconds: float = field(default=1.0, metadata=_duration())
    commit_share: float = field(default=0.5, metadata=_key(_share))
    commit_seconds: float = field(default=1.0, metadata=_duration())
    staging_share: float = field(default=0.5, metadata=_key(_share))
    staging_seconds: float = field(default=1.0, metadata=_duration())
    staging_network_share: float = field(default=0.25, metadata=_key(_share))
    contention_deadline_share: float = field(default=0.8, metadata=_key(_share))
    backlog_saves: int = field(default=3, metadata=_key(whole_number(2, 12)))
    backlog_growth: float = field(default=1.5, metadata=_key(_growth))
    backlog_in_flight: int = field(default=1, metadata=_key(whole_number(1, MAX_COUNT)))
    backlog_seconds: float = field(default=1.0, metadata=_duration())
    gpu_share: float = field(default=0.5, metadata=_key(_share))
    gpu_baseline: float = field(default=0.2, metadata=_key(_share))
    telemetry_grace: float = field(default=10.0, metadata=_duration())


def hashmod(name: str, modulus: int) -> int:
    """Prometheus' ``hashmod`` relabel action on one label value: the last 8 bytes of the md5
    digest as a big-endian unsigned integer, modulo ``modulus`` -- so an operator can check which
    shard owns a job with the same relabel rule, and ownership depends on the name alone."""
    digest = hashlib.md5(name.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[8:], "big") % modulus


@dataclass(frozen=True)
class Serving:
    """What this process serves (``--scope``, ``--shard``): the scopes it reads, and which shard
    of the jobs' shared trees is its own. The default, both scopes and one shard, is one machine
    watching everything."""

    scopes: frozenset[str] = frozenset({NODE, SHARED})
    shard: int = 0
    shards: int = 1

    @property
    def default(self) -> bool:
        return self == Serving()

    @property
    def scope_label(self) -> str:
        return ",".join(sorted(self.scopes))

    def owns(self, job: str) -> bool:
        return self.shards == 1 or hashmod(job, self.shards) == self.shard

    def serves(self, scope: str, job: str) -> bool:
        """Whether this process reads a tier of ``scope`` of ``job``."""
        return scope in self.scopes and (scope == NODE or self.owns(job))

    def tracks(self, job: str) -> bool:
        """Whether ``job`` has any state here: every job has node-scope state on a node (its
        spool, its telemetry); a shared-scope process keeps only the jobs of its shard."""
        return NODE in self.scopes or self.owns(job)


def parse_serving(scope: str | None, shard: str | None) -> Serving:
    """``--scope`` (node, shared, or node,shared) and ``--shard`` (i/N); ValueError says why."""
    scopes = Serving().scopes
    if scope is not None:
        names = [name.strip() for name in scope.split(",")]
        unknown = [name for name in names if name not in (NODE, SHARED)]
        if unknown:
            raise ValueError(
                f"--scope={scope}: expected node, shared or node,shared (got {unknown[0]!r})"
            )
        scopes = frozenset(names)
    if shard is None:
        return Serving(scopes)
    match = re.fullmatch(r"(\d+)/(\d+)", shard.strip())
    if match is None:
        raise ValueError(f"--shard={shard}: expected i/N, e.g. 0/4 (shard i of N, 0 <= i < N)")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1:
        raise ValueError(f"--shard={shard}: the number of shards must be at least 1")
    if index >= count:
        raise ValueError(f"--shard={shard}: the shard index must be below {count} (0 <= i < N)")
    if SHARED not in scopes:
        raise ValueError(
            f"--shard={shard} needs the shared scope: a --scope=node process serves every job "
            "on its node, and only shared trees are split between shards"
        )
    return Serving(scopes, index, count)


@dataclass(frozen=True)
class Config:
    source: Path | None = None
    web: WebConfig = field(default_factory=WebConfig, metadata=_section())
    paths: PathsConfig = field(default_factory=PathsConfig, metadata=_section())
    spool: Path = field(default=Path("/var/lib/checkpoint-exporter/spool"), metadata=_path())
    # Spool files untouched this long are removed.
    spool_retention: float = field(default=7 * 86400.0, metadata=_duration())
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig, metadata=_section())
    scan: ScanConfig = field(default_factory=ScanConfig, metadata=_section())
    defaults: Policy = field(default_factory=Policy, metadata=_section())
    diagnosis: DiagnosisThresholds = field(default_factory=DiagnosisThresholds, metadata=_section())
    jobs: tuple[JobConfig, ...] = field(default=(), metadata=_entries())
    discover: tuple[DiscoverConfig, ...] = field(default=(), metadata=_entries())
    serving: Serving = field(default_factory=Serving)  # from the flags, not the file
    # What is worth saying but stops nothing (a watched directory that does not exist yet).
    warnings: tuple[ConfigProblem, ...] = ()


# --- the key tables, read from the dataclasses --------------------------------------------------

POLICY_FIELDS = key_fields(Policy)
_POLICY_KEYS = key_names(Policy)
# A discovered job pages only when these were stated for it (not left to the built-in defaults).
OBJECTIVE_KEYS = frozenset({"interval", "deadline"})
TELEMETRY_FIELDS = key_fields(TelemetryConfig)
SCAN_FIELDS = key_fields(ScanConfig)
DIAGNOSIS_FIELDS = key_fields(DiagnosisThresholds)


# --- checks beyond one value ------------------------------------------------------------------


# A configured directory on a hung mount must not stop the exporter from starting (or a reload
# from finishing): its check gets this long, then the scanner's per-mount workers take over and
# report the mount stuck.
DIRECTORY_CHECK_SECONDS = 5.0


class _DirectoryChecks:
    """The directory checks of one load, on one daemon thread, each with a time budget. Once a
    check overruns, the thread is presumed stuck in the kernel and the remaining checks are
    skipped with a warning rather than queued behind it."""

    def __init__(self, budget: float = DIRECTORY_CHECK_SECONDS) -> None:
        self.budget = budget
        self.stuck: Path | None = None

    def run(self, directory: Path) -> tuple[int | OSError, bool, Path] | None:
        """(st_mode or the error, readable, real path), or None when it did not answer."""
        if self.stuck is not None:
            log.warning("config: %s not checked: %s did not answer", directory, self.stuck)
            return None
        result: list[tuple[int | OSError, bool, Path]] = []

        def check() -> None:
            try:
                mode: int | OSError = os.stat(directory).st_mode
            except OSError as error:
                mode = error
            readable = isinstance(mode, int) and os.access(directory, os.R_OK | os.X_OK)
            result.append((mode, readable, Path(os.path.realpath(directory))))

        worker = threading.Thread(target=check, name="config check", daemon=True)
        worker.start()
        worker.join(self.budget)
        if not result:
            self.stuck = directory
            log.warning(
                "config: %s did not answer within %g s (a hung mount?): watched anyway, "
                "its mount is reported stuck while it does not answer", directory, self.budget,
            )  # fmt: skip
            return None
        return result[0]


def _readable_directory(
    problems: Problems, notes: Problems, path: KeyPath, directory: Path, checks: _DirectoryChecks
) -> Path:
    """Check ``directory``; returns its real path (itself when it could not be resolved).

    A directory that does not exist, or cannot be read, is a note, not a problem: jobs are
    configured before they make their directories and removed after, and a permission is
    fixed while the exporter runs. The scanner watches for it and exports what it finds
    (checkpoint_exporter_path_missing, checkpoint_exporter_unreadable_paths). A path that is
    there and is no directory is a mistake in the file."""
    answer = checks.run(directory)
    if answer is None:
        return directory
    mode, readable, resolved = answer
    if isinstance(mode, FileNotFoundError):
        notes.add(path, f"{directory} does not exist yet: watched from when it appears")
    elif isinstance(mode, PermissionError):
        notes.add(path, f"{directory} cannot be reached: permission denied on a parent")
    elif isinstance(mode, OSError):
        notes.add(path, f"{directory} cannot be checked: {mode.strerror}")
    elif not stat.S_ISDIR(mode):
        problems.add(path, f"{directory} is not a directory")
    elif not readable:
        notes.add(
            path,
            f"{directory} is not readable by uid {os.geteuid()}: "
            "the exporter needs read and search (r-x) permission",
        )
    return resolved


def _checked(serving: Serving, scope: str, job: str | None) -> bool:
    """Whether loading checks a directory of ``scope``: not one this process never reads (a
    node-scope process may not even mount the shared roots), nor, in a process serving one
    scope, an ``auto`` one, whose scope its mount decides when the scanner places it."""
    if scope == "auto":
        return serving.scopes == {NODE, SHARED} and (job is None or serving.owns(job))
    return scope in serving.scopes and (job is None or serving.serves(scope, job))


def _policy(values: dict[str, Any], base: Policy) -> Policy:
    return replace(base, **{k: v for k, v in values.items() if k in _POLICY_KEYS})


def _web(
    problems: Problems, raw: object, path: Parser, other_files: list[ConfigProblem]
) -> WebConfig:
    web = WebConfig(**problems.check(raw, ("web",), key_fields(WebConfig, path)))
    if web.config_file is not None and not os.access(web.config_file, os.R_OK):
        problems.add(("web", "config_file"), f"{web.config_file} does not exist or is not readable")
    elif web.config_file is not None:
        # check-config checks the web config it names too, so no problem waits for serve.
        from checkpoint_exporter.webconfig import load_web_config

        try:
            load_web_config(web.config_file)
        except ConfigError as error:
            other_files.extend(error.problems)
    return web


def _telemetry(problems: Problems, raw: object) -> TelemetryConfig:
    telemetry = TelemetryConfig(**problems.check(raw, ("telemetry",), TELEMETRY_FIELDS))
    samples = telemetry.retention / telemetry.sample_interval
    if samples > MAX_RING_SAMPLES:
        key = (
            "sample_interval" if isinstance(raw, dict) and "sample_interval" in raw else "retention"
        )
        problems.add(
            ("telemetry", key),
            f"retention {format_duration(telemetry.retention)} at one sample every "
            f"{format_duration(telemetry.sample_interval)} is {samples:,.0f} samples a series; "
            f"at most {MAX_RING_SAMPLES:,} are kept (sample less often or keep less)",
        )
    return telemetry


def _parse(
    data: object,
    problems: Problems,
    notes: Problems,
    base_dir: Path,
    other_files: list[ConfigProblem],
    serving: Serving,
) -> Config:
    path = _path_parser(base_dir)
    top = problems.check(data, (), key_fields(Config, path))
    stated = problems.check(top.get("defaults"), ("defaults",), POLICY_FIELDS)
    defaults = _policy(stated, Policy())
    return Config(
        source=None,
        web=_web(problems, top.get("web"), path, other_files),
        paths=PathsConfig(
            **problems.check(top.get("paths"), ("paths",), key_fields(PathsConfig, path))
        ),
        telemetry=_telemetry(problems, top.get("telemetry")),
        scan=ScanConfig(**problems.check(top.get("scan"), ("scan",), SCAN_FIELDS)),
        defaults=defaults,
        diagnosis=DiagnosisThresholds(
            **problems.check(top.get("diagnosis"), ("diagnosis",), DIAGNOSIS_FIELDS)
        ),
        jobs=_jobs(problems, notes, top.get("jobs"), path, defaults, set(stated), serving),
        discover=_discover(
            problems, notes, top.get("discover"), path, defaults, set(stated), serving
        ),
        serving=serving,
        **_values_of(Config, top),  # the values at the top (spool, spool_retention)
    )


def _list(problems: Problems, raw: object, key: str) -> list[object]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        problems.add((key,), f"expected a list, got {type_name(raw)}")
        return []
    return raw


def _jobs(
    problems: Problems,
    notes: Problems,
    raw: object,
    path: Parser,
    defaults: Policy,
    stated_defaults: set[str],
    serving: Serving,
) -> tuple[JobConfig, ...]:
    table = key_fields(JobConfig, _object_or_path(path))
    required = [f.key for f in table if f.required]
    jobs: list[JobConfig] = []
    names: dict[str, int] = {}
    watched: dict[Path, KeyPath] = {}
    checks = _DirectoryChecks()
    for index, entry in enumerate(_list(problems, raw, "jobs")):
        at: KeyPath = ("jobs", index)
        values = problems.check(entry, at, table)
        name = values.get("name")
        if name is not None:
            if name in names:
                problems.add(
                    (*at, "name"), f"duplicate job name {name!r} (also jobs[{names[name]}])"
                )
            names.setdefault(name, index)
        scopes = {"path": values.get("scope", defaults.scope), "staging": "auto"}
        for tier_key in ("path", "staging"):
            directory = values.get(tier_key)
            if directory is None or not _checked(serving, scopes[tier_key], name):
                continue
            if is_object_url(directory):
                # Not reached from here: the daemon reports a bucket it cannot list per job.
                resolved = directory
            else:
                resolved = _readable_directory(problems, notes, (*at, tier_key), directory, checks)
            if resolved in watched:
                problems.add(
                    (*at, tier_key),
                    f"{directory} is already watched as {format_key(watched[resolved])}",
                )
            watched.setdefault(resolved, (*at, tier_key))
        objects = [key for key in ("path", "staging") if is_object_url(values.get(key, ""))]
        _check_storage_options(problems, at, values, {scheme_of(values[key]) for key in objects})
        if all(key in values for key in required):
            policy = _policy(values, defaults)
            if objects and "poll_interval" not in values and "poll_interval" not in stated_defaults:
                policy = replace(policy, poll_interval=OBJECT_POLL_INTERVAL)
            jobs.append(JobConfig(**_values_of(JobConfig, values), policy=policy))
    return tuple(jobs)


def _check_storage_options(
    problems: Problems, at: KeyPath, values: dict[str, Any], schemes: set[str | None]
) -> None:
    """``storage_options`` only beside an object URL, each option for its own kind of store."""
    if values.get("storage_options") and not schemes:
        problems.add((*at, "storage_options"), "is for object URLs (s3://): path names none")
        return
    for name, _ in values.get("storage_options") or ():
        if SCHEME_OPTIONS.get(name, "") not in ("", *schemes):
            problems.add(
                (*at, "storage_options", name),
                f"is for {SCHEME_OPTIONS[name]}:// only; the object URLs here are "
                + ", ".join(f"{scheme}://" for scheme in sorted(map(str, schemes))),
            )


def _discover(
    problems: Problems,
    notes: Problems,
    raw: object,
    path: Parser,
    defaults: Policy,
    stated_defaults: set[str],
    serving: Serving,
) -> tuple[DiscoverConfig, ...]:
    table = key_fields(DiscoverConfig, _object_or_path(path))
    entries: list[DiscoverConfig] = []
    checks = _DirectoryChecks()
    for index, entry in enumerate(_list(problems, raw, "discover")):
        at: KeyPath = ("discover", index)
        values = problems.check(entry, at, table)
        if "root" not in values:
            continue
        scheme = scheme_of(str(values["root"]))
        _check_storage_options(problems, at, values, {scheme} - {None})
        if scheme is None and _checked(serving, values.get("scope", defaults.scope), None):
            _readable_directory(problems, notes, (*at, "root"), values["root"], checks)
        policy = _policy(values, defaults)
        if scheme and "poll_interval" not in values and "poll_interval" not in stated_defaults:
            policy = replace(policy, poll_interval=OBJECT_POLL_INTERVAL)
        if "page" not in values and "page" not in stated_defaults:
            # Every run under a root is held to the objectives stated for the root; where none
            # were, the built-in defaults are a guess, and a guess must not page anyone.
            policy = replace(policy, page=(set(values) | stated_defaults) >= OBJECTIVE_KEYS)
        entries.append(DiscoverConfig(**_values_of(DiscoverConfig, values), policy=policy))
    return tuple(entries)


def parse_config(
    text: str,
    file: str = "<config>",
    base_dir: Path | None = None,
    serving: Serving = Serving(),
) -> Config:
    """Parse config text; relative paths are taken relative to ``base_dir``. ``serving``: what
    the process serves (its directories outside that are not checked)."""
    document = read_yaml(text, file)
    problems = Problems.of(file, document)
    if document.problems and document.data is None:
        raise ConfigError(problems.found)
    notes = Problems(file, document.lines, document.refused)
    other_files: list[ConfigProblem] = []  # problems of the web config file it names
    config = _parse(document.data, problems, notes, base_dir or Path.cwd(), other_files, serving)
    if problems.found or other_files:
        found = sorted(problems.found, key=lambda p: (p.line or 0, p.key))
        raise ConfigError(found + other_files)
    return replace(config, warnings=tuple(notes.found))


def load_config(path: str | os.PathLike[str], serving: Serving = Serving()) -> Config:
    """Read and validate a config file. Relative paths inside are relative to the file."""
    file = Path(path)
    config = parse_config(read_config_text(file), str(file), file.resolve().parent, serving)
    return replace(config, source=file)


def load_web_section(path: str | os.PathLike[str]) -> WebConfig:
    """Only the file's ``web:`` block, checked as load_config checks it: what `healthcheck`
    needs to find the server. The rest is not read: a job's mistake (which a running serve
    outlives, keeping its configuration) or a watched directory on a hung mount is no reason
    for a liveness probe to fail."""
    file = Path(path)
    document = read_yaml(read_config_text(file), str(file))
    problems = Problems.of(str(file), document)
    if document.problems and document.data is None:
        raise ConfigError(problems.found)
    data = {} if document.data is None else document.data
    if not isinstance(data, dict):
        raise ConfigError([ConfigProblem(str(file), "", "expected a mapping")])
    other_files: list[ConfigProblem] = []
    web = _web(problems, data.get("web"), _path_parser(file.resolve().parent), other_files)
    if problems.found or other_files:
        raise ConfigError(problems.found + other_files)
    return web


# --- the resolved view that check-config prints ----------------------------------------------


def config_to_dict(config: Config) -> dict[str, Any]:
    """Every setting with defaults filled in, in the file's own notation."""
    return dumped(config)
