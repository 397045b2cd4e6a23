"""YAML -> typed config.

Every problem in a file is reported at once, each naming the file, the line, the key path and the
reason, so one edit-and-check cycle fixes them all. YAML is read with the safe loader only, and
the loader refuses language tags, duplicate keys and alias expansions that blow up in size.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from checkpoint_exporter.units import format_duration, parse_duration

# Outside the crowded 9100-9999 exporter allocations, and clear of the neighbours on a GPU node:
# node_exporter 9100, dcgm-exporter 9400, OpenTelemetry 9464, kubelet 10250-10259, Thanos 10901/2.
DEFAULT_PORT = 25780
DEFAULT_LISTEN_ADDRESS = f":{DEFAULT_PORT}"

LAYOUTS = ("auto", "dcp", "torchtitan", "megatron", "nemo", "deepspeed", "hf", "lightning", "orbax")
WATCH_MODES = ("auto", "inotify", "poll")
GPU_MODES = ("auto", "on", "off")

# A job name is a label value and the name of the job's spool directory.
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# Bounds what a hostile or mistaken file can make the loader build (alias "billion laughs").
_MAX_YAML_NODES = 100_000

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class Policy:
    """The objectives and knobs a job inherits from ``defaults`` and may override."""

    interval: float = 15 * 60.0
    deadline: float = 60.0
    retained_generations: int = 3
    capacity_reserve: float = 0.20
    restore_drill_max_age: float = 7 * 86400.0
    layout: str = "auto"
    watch: str = "auto"
    poll_interval: float = 5.0  # rescan period when polling (network filesystems)
    verify_checksums: bool = False  # Megatron integrity.json sha256, read at a capped rate
    # How long a generation with no commit marker (a single-file checkpoint, DeepSpeed without
    # `latest`) must stay unchanged before it is judged: long enough that a copy or a slow
    # writer between two chunks is not taken for finished, short next to any deadline.
    settle: float = 5.0


@dataclass(frozen=True)
class ScanConfig:
    """How hard the scanner may work shared storage."""

    metadata_ops_per_second: float = 10_000  # on network filesystems; 0 = no limit
    reconcile_interval: float = 3600.0  # full relisting, also after an inotify overflow
    max_depth: int = 8
    checksum_bytes_per_second: float = 200e6
    # Address space of the worker that parses DCP .metadata (see dcp_metadata.IsolatedParser):
    # a real file needs up to about 16 times its size, so 768 MiB checks files up to ~40 MiB.
    # The pod's memory limit must leave this much beside the daemon.
    metadata_memory_bytes: int = 768 * 1024 * 1024


@dataclass(frozen=True)
class JobConfig:
    name: str
    path: Path
    staging: Path | None
    policy: Policy


@dataclass(frozen=True)
class DiscoverConfig:
    root: Path
    max_jobs: int
    forget_after: float
    policy: Policy


@dataclass(frozen=True)
class ListenAddress:
    host: str  # "" means every interface
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class WebConfig:
    listen_address: str = DEFAULT_LISTEN_ADDRESS
    telemetry_path: str = "/metrics"
    config_file: Path | None = None


@dataclass(frozen=True)
class PathsConfig:
    procfs: Path = Path("/proc")
    sysfs: Path = Path("/sys")
    rootfs: Path = Path("/")


@dataclass(frozen=True)
class TelemetryConfig:
    sample_interval: float = 1.0
    network_devices: str = "^(eth|en|ib|mlx|bond)"
    infiniband: bool = True
    gpu: str = "auto"
    retention: float = 3600.0  # how far back samples are kept: the longest save to correlate


@dataclass(frozen=True)
class Config:
    source: Path | None = None
    web: WebConfig = field(default_factory=WebConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    spool: Path = Path("/var/lib/checkpoint-exporter/spool")
    spool_retention: float = 7 * 86400.0  # spool files untouched this long are removed
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    scan: ScanConfig = field(default_factory=ScanConfig)
    defaults: Policy = field(default_factory=Policy)
    jobs: tuple[JobConfig, ...] = ()
    discover: tuple[DiscoverConfig, ...] = ()


@dataclass(frozen=True)
class ConfigProblem:
    file: str
    key: str
    reason: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.key}: {self.reason}" if self.key else f"{where}: {self.reason}"


class ConfigError(Exception):
    """One or more problems in a config file; ``problems`` lists them all."""

    def __init__(self, problems: list[ConfigProblem]):
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


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


def _type_name(value: object) -> str:
    return {dict: "a mapping", list: "a list", type(None): "nothing"}.get(
        type(value), type(value).__name__
    )


def _positive_duration(value: object) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError("must be greater than zero")
    return seconds


# Upper bounds of counts and rates. Each value ends up in a float (a gauge, a token bucket) or
# sizes something (a ring buffer, a recursion): past these it overflows, runs out of memory or
# out of stack at run time, so it is refused when the file is loaded instead.
MAX_COUNT = 1_000_000
MAX_SCAN_DEPTH = 64  # the listing recurses once per level
MAX_OPS_PER_SECOND = 1e9  # metadata operations: far beyond any filesystem; 0 means no limit
MAX_BYTES_PER_SECOND = 1e13  # 10 TB/s: far beyond any disk; 0 means no limit
MAX_RING_SAMPLES = 100_000  # telemetry.retention / telemetry.sample_interval: 1.6 MB a series


def _shown(value: object) -> str:
    """``value`` for an error message, cut short: a 5,000-digit number is not worth echoing."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} characters)"


def _whole_number(minimum: int, maximum: int = MAX_COUNT) -> Callable[[object], int]:
    def parse(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected a whole number, got {_type_name(value)} {_shown(value)}")
        if value < minimum:
            raise ValueError(f"must be at least {minimum}, got {_shown(value)}")
        if value > maximum:
            raise ValueError(f"must be at most {maximum:,}, got {_shown(value)}")
        return value

    return parse


def _fraction(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            f"expected a number between 0 and 1, got {_type_name(value)} {_shown(value)}"
        )
    if not 0 <= value < 1:
        raise ValueError(
            f"must be at least 0 and below 1 (a share of the space), got {_shown(value)}"
        )
    return float(value)


def _rate(maximum: float) -> Callable[[object], float]:
    """A non-negative, finite number of at most ``maximum`` (per second; 0 = no limit)."""

    def parse(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {_type_name(value)} {_shown(value)}")
        # Compared before any conversion: float() of a huge int would itself overflow.
        if isinstance(value, float) and math.isnan(value):
            raise ValueError("expected a number, got nan")
        if value < 0:
            raise ValueError(f"must not be negative, got {_shown(value)}")
        if value > maximum:
            raise ValueError(f"must be at most {maximum:g} (0 means no limit), got {_shown(value)}")
        return float(value)

    return parse


def _choice(options: tuple[str, ...]) -> Callable[[object], str]:
    def parse(value: object) -> str:
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)}; got {value!r}")
        return str(value)

    return parse


def _boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _text(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {_type_name(value)} {value!r}")
    return value


def _regex(value: object) -> str:
    text = _text(value)
    try:
        re.compile(text)
    except re.error as error:
        raise ValueError(f"invalid regular expression {text!r}: {error}") from None
    return text


def _telemetry_path(value: object) -> str:
    text = _text(value)
    if not text.startswith("/"):
        raise ValueError(f"must start with '/', got {_shown(text)}")
    if any(c.isspace() or not c.isprintable() or c in "?#" for c in text):
        raise ValueError(
            f"must be a plain URL path (no spaces, control characters, '?' or '#'), "
            f"got {_shown(text)}"
        )
    return text


def _job_name(value: object) -> str:
    text = _text(value)
    if not _JOB_NAME.fullmatch(text):
        raise ValueError(
            f"invalid job name {text!r}: use letters, digits, '.', '_' and '-' (at most 128, "
            "starting with a letter or digit); it becomes a label value and a spool directory name"
        )
    return text


def _listen_address(value: object) -> str:
    parse_listen_address(value)  # type: ignore[arg-type]
    return str(value)


_POLICY_FIELDS: dict[str, Callable[[object], Any]] = {
    "interval": _positive_duration,
    "deadline": _positive_duration,
    "retained_generations": _whole_number(1),
    "capacity_reserve": _fraction,
    "restore_drill_max_age": _positive_duration,
    "layout": _choice(LAYOUTS),
    "watch": _choice(WATCH_MODES),
    "poll_interval": _positive_duration,
    "verify_checksums": _boolean,
    "settle": _positive_duration,
}


# --- YAML with line numbers -----------------------------------------------------------------

KeyPath = tuple[str | int, ...]


def format_key(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _YamlProblem(Exception):
    def __init__(self, path: KeyPath, reason: str, line: int | None, refused: bool = True):
        super().__init__(reason)
        self.path, self.reason, self.line, self.refused = path, reason, line, refused


class _Reader:
    """Turns a composed YAML node tree into plain data, remembering each key's line."""

    def __init__(self, loader: yaml.SafeLoader):
        self.loader = loader
        self.lines: dict[KeyPath, int] = {}
        self.problems: list[_YamlProblem] = []
        self.nodes = 0

    def read(self, node: Node, path: KeyPath) -> Any:
        """Plain data for ``node``; a refused node is recorded as a problem and read as None."""
        self.nodes += 1
        if self.nodes > _MAX_YAML_NODES:
            raise _YamlProblem(
                path,
                f"more than {_MAX_YAML_NODES} values (an alias expansion?); refusing to load",
                _line(node),
            )
        self.lines.setdefault(path, _line(node))
        expected = {MappingNode: _MAP_TAG, SequenceNode: _SEQ_TAG}.get(type(node))
        if expected is not None and node.tag != expected:
            return self._refuse(path, node, f"YAML tag {_short_tag(node.tag)} is not allowed")
        if isinstance(node, MappingNode):
            return self._mapping(node, path)
        if isinstance(node, SequenceNode):
            return [self.read(item, (*path, i)) for i, item in enumerate(node.value)]
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as error:
            return self._refuse(path, node, _yaml_reason(error))

    def _refuse(self, path: KeyPath, node: Node, reason: str) -> None:
        self.problems.append(_YamlProblem(path, reason, _line(node)))

    def _mapping(self, node: MappingNode, path: KeyPath) -> dict[Any, Any] | None:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, ScalarNode):
                continue
            key = key_node.value
            if key in seen:
                self.problems.append(
                    _YamlProblem(
                        (*path, key),
                        f"duplicate key (first defined on line {seen[key]}); "
                        "YAML would silently keep only the last one",
                        _line(key_node),
                        refused=False,
                    )
                )
            seen.setdefault(key, _line(key_node))
        try:
            self.loader.flatten_mapping(node)  # resolves "<<" merge keys
        except yaml.YAMLError as error:
            return self._refuse(path, node, _yaml_reason(error))
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                self._refuse(path, key_node, "keys must be plain strings")
                continue
            key = self.read(key_node, path)
            if not isinstance(key, (str, int)):
                key = str(key)
            self.lines[(*path, key)] = _line(key_node)
            result[key] = self.read(value_node, (*path, key))
        return result


def _short_tag(tag: str) -> str:
    return tag.replace("tag:yaml.org,2002:", "!!")


def _line(node: Node) -> int:
    return node.start_mark.line + 1


def _yaml_reason(error: yaml.YAMLError) -> str:
    problem = getattr(error, "problem", None)
    context = getattr(error, "context", None)
    text = " ".join(str(part) for part in (context, problem) if part) or str(error)
    return f"invalid YAML: {text}"


@dataclass
class YamlDocument:
    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)  # key path -> line number
    problems: list[ConfigProblem] = field(default_factory=list)
    refused: set[KeyPath] = field(default_factory=set)  # values read as None because refused


def read_yaml(text: str, file: str) -> YamlDocument:
    """Plain data from YAML text, with each key's line; problems are collected, not raised."""
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # rejects NUL and other control characters itself
        node = loader.get_single_node()
        if node is None:
            return YamlDocument(None)
        reader = _Reader(loader)
        data = reader.read(node, ())
        return YamlDocument(
            data,
            reader.lines,
            [ConfigProblem(file, format_key(p.path), p.reason, p.line) for p in reader.problems],
            {p.path for p in reader.problems if p.refused},
        )
    except _YamlProblem as problem:
        return YamlDocument(
            None,
            problems=[ConfigProblem(file, format_key(problem.path), problem.reason, problem.line)],
        )
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark else None
        return YamlDocument(None, problems=[ConfigProblem(file, "", _yaml_reason(error), line)])
    except yaml.YAMLError as error:
        return YamlDocument(None, problems=[ConfigProblem(file, "", _yaml_reason(error))])
    except RecursionError:
        reason = "nested too deeply to be a configuration; refusing to load"
        return YamlDocument(None, problems=[ConfigProblem(file, "", reason)])
    except ValueError as error:  # e.g. a number of more digits than int() converts
        return YamlDocument(None, problems=[ConfigProblem(file, "", str(error))])
    finally:
        if loader is not None:
            loader.dispose()


# --- validation ------------------------------------------------------------------------------


class _Checker:
    """Collects problems instead of stopping at the first."""

    def __init__(self, file: str, lines: dict[KeyPath, int], base_dir: Path, refused: set[KeyPath]):
        self.file, self.lines, self.base_dir = file, lines, base_dir
        # Values the YAML reader already refused: their follow-on problems would be noise.
        self.refused = refused
        self.problems: list[ConfigProblem] = []
        self.other_files: list[ConfigProblem] = []  # problems of the web config file it names

    def error(self, path: KeyPath, reason: str) -> None:
        if any(path[:depth] in self.refused for depth in range(len(path) + 1)):
            return
        line = None
        for depth in range(len(path), -1, -1):
            line = self.lines.get(path[:depth])
            if line is not None:
                break
        self.problems.append(ConfigProblem(self.file, format_key(path), reason, line))

    def section(
        self,
        raw: object,
        path: KeyPath,
        fields: Mapping[str, Callable[[object], Any]],
        required: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """Parse a mapping whose keys must be ``fields``; a bad value is reported and dropped."""
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            self.error(path, f"expected a mapping, got {_type_name(raw)}")
            return {}
        values: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in fields:
                self.error((*path, key), "unknown key" + _did_you_mean(key, fields))
                continue
            try:
                values[key] = fields[key](value)
            except ValueError as error:
                self.error((*path, key), str(error))
        for key in required:
            if key not in raw:
                self.error(path, f"missing required key {key!r}")
        return values

    def path(self, value: object) -> Path:
        text = _text(value)
        # No file name can hold NUL, and every system call refuses it: say so here rather than
        # let os.stat raise at start-up.
        if "\0" in text:
            raise ValueError(f"a path cannot contain a NUL character, got {_shown(text)}")
        try:
            path = Path(text).expanduser()
        except RuntimeError as error:  # "~" without a home directory
            raise ValueError(f"cannot expand {_shown(text)}: {error}") from None
        return path if path.is_absolute() else self.base_dir / path

    def readable_directory(self, path: KeyPath, directory: Path) -> None:
        try:
            mode = os.stat(directory).st_mode
        except FileNotFoundError:
            self.error(path, f"{directory} does not exist")
            return
        except PermissionError:
            self.error(path, f"{directory} cannot be reached: permission denied on a parent")
            return
        except OSError as error:
            self.error(path, f"{directory} cannot be checked: {error.strerror}")
            return
        if not stat.S_ISDIR(mode):
            self.error(path, f"{directory} is not a directory")
        elif not os.access(directory, os.R_OK | os.X_OK):
            self.error(
                path,
                f"{directory} is not readable by uid {os.geteuid()}: "
                "the exporter needs read and search (r-x) permission",
            )


def did_you_mean(key: object, options: Iterable[str]) -> str:
    """'; did you mean 'x'?' for the closest option, or nothing when none is close."""
    close = difflib.get_close_matches(str(key), sorted(options), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _did_you_mean(key: object, options: Mapping[str, object]) -> str:
    return f"{did_you_mean(key, options)} (known keys: {', '.join(sorted(options))})"


def _policy(values: dict[str, Any], base: Policy) -> Policy:
    return replace(base, **{k: v for k, v in values.items() if k in _POLICY_FIELDS})


def _parse(data: object, checker: _Checker) -> Config:
    top = checker.section(
        data,
        (),
        {
            "web": lambda v: v,
            "paths": lambda v: v,
            "spool": checker.path,
            "spool_retention": _positive_duration,
            "telemetry": lambda v: v,
            "scan": lambda v: v,
            "defaults": lambda v: v,
            "jobs": lambda v: v,
            "discover": lambda v: v,
        },
    )
    web = WebConfig(
        **checker.section(
            top.get("web"),
            ("web",),
            {
                "listen_address": _listen_address,
                "telemetry_path": _telemetry_path,
                "config_file": lambda v: None if v is None else checker.path(v),
            },
        )
    )
    if web.config_file is not None and not os.access(web.config_file, os.R_OK):
        checker.error(
            ("web", "config_file"), f"{web.config_file} does not exist or is not readable"
        )
    elif web.config_file is not None:
        # check-config checks the web config it names too, so no problem waits for serve.
        from checkpoint_exporter.webconfig import load_web_config

        try:
            load_web_config(web.config_file)
        except ConfigError as error:
            checker.other_files.extend(error.problems)
    paths = PathsConfig(
        **checker.section(
            top.get("paths"),
            ("paths",),
            {"procfs": checker.path, "sysfs": checker.path, "rootfs": checker.path},
        )
    )
    telemetry = TelemetryConfig(
        **checker.section(
            top.get("telemetry"),
            ("telemetry",),
            {
                "sample_interval": _positive_duration,
                "network_devices": _regex,
                "infiniband": _boolean,
                "gpu": _choice(GPU_MODES),
                "retention": _positive_duration,
            },
        )
    )
    if telemetry.retention / telemetry.sample_interval > MAX_RING_SAMPLES:
        raw = top.get("telemetry")
        key = (
            "sample_interval" if isinstance(raw, dict) and "sample_interval" in raw else "retention"
        )
        checker.error(
            ("telemetry", key),
            f"retention {format_duration(telemetry.retention)} at one sample every "
            f"{format_duration(telemetry.sample_interval)} is "
            f"{telemetry.retention / telemetry.sample_interval:,.0f} samples a series; at most "
            f"{MAX_RING_SAMPLES:,} are kept (sample less often or keep less)",
        )
    scan = ScanConfig(
        **checker.section(
            top.get("scan"),
            ("scan",),
            {
                "metadata_ops_per_second": _rate(MAX_OPS_PER_SECOND),
                "reconcile_interval": _positive_duration,
                "max_depth": _whole_number(1, MAX_SCAN_DEPTH),
                "checksum_bytes_per_second": _rate(MAX_BYTES_PER_SECOND),
                "metadata_memory_bytes": _whole_number(64 << 20, 1 << 40),
            },
        )
    )
    defaults = _policy(
        checker.section(top.get("defaults"), ("defaults",), _POLICY_FIELDS), Policy()
    )
    jobs = _jobs(checker, top.get("jobs"), defaults)
    discover = _discover(checker, top.get("discover"), defaults)
    config = Config(
        source=None,
        web=web,
        paths=paths,
        telemetry=telemetry,
        scan=scan,
        defaults=defaults,
        jobs=jobs,
        discover=discover,
    )
    overrides = {key: top[key] for key in ("spool", "spool_retention") if key in top}
    return replace(config, **overrides)


def _list(checker: _Checker, raw: object, key: str) -> list[object]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        checker.error((key,), f"expected a list, got {_type_name(raw)}")
        return []
    return raw


def _jobs(checker: _Checker, raw: object, defaults: Policy) -> tuple[JobConfig, ...]:
    fields = {
        "name": _job_name,
        "path": checker.path,
        "staging": lambda v: None if v is None else checker.path(v),
        **_POLICY_FIELDS,
    }
    jobs: list[JobConfig] = []
    names: dict[str, int] = {}
    watched: dict[Path, KeyPath] = {}
    for index, entry in enumerate(_list(checker, raw, "jobs")):
        at: KeyPath = ("jobs", index)
        values = checker.section(entry, at, fields, required=("name", "path"))
        name = values.get("name")
        if name is not None:
            if name in names:
                checker.error(
                    (*at, "name"), f"duplicate job name {name!r} (also jobs[{names[name]}])"
                )
            names.setdefault(name, index)
        for tier_key in ("path", "staging"):
            directory = values.get(tier_key)
            if directory is None:
                continue
            checker.readable_directory((*at, tier_key), directory)
            resolved = Path(os.path.realpath(directory))
            if resolved in watched:
                checker.error(
                    (*at, tier_key),
                    f"{directory} is already watched as {format_key(watched[resolved])}",
                )
            watched.setdefault(resolved, (*at, tier_key))
        if name is not None and "path" in values:
            jobs.append(
                JobConfig(name, values["path"], values.get("staging"), _policy(values, defaults))
            )
    return tuple(jobs)


def _discover(checker: _Checker, raw: object, defaults: Policy) -> tuple[DiscoverConfig, ...]:
    fields = {
        "root": checker.path,
        "max_jobs": _whole_number(1),
        "forget_after": _positive_duration,
        **_POLICY_FIELDS,
    }
    entries: list[DiscoverConfig] = []
    for index, entry in enumerate(_list(checker, raw, "discover")):
        at: KeyPath = ("discover", index)
        values = checker.section(entry, at, fields, required=("root",))
        if "root" not in values:
            continue
        checker.readable_directory((*at, "root"), values["root"])
        entries.append(
            DiscoverConfig(
                root=values["root"],
                max_jobs=values.get("max_jobs", 200),
                forget_after=values.get("forget_after", 86400.0),
                policy=_policy(values, defaults),
            )
        )
    return tuple(entries)


def parse_config(text: str, file: str = "<config>", base_dir: Path | None = None) -> Config:
    """Parse config text; relative paths are taken relative to ``base_dir``."""
    document = read_yaml(text, file)
    checker = _Checker(file, document.lines, base_dir or Path.cwd(), document.refused)
    checker.problems.extend(document.problems)
    if document.problems and document.data is None:
        raise ConfigError(checker.problems)
    config = _parse(document.data, checker)
    if checker.problems or checker.other_files:
        problems = sorted(checker.problems, key=lambda p: (p.line or 0, p.key))
        raise ConfigError(problems + checker.other_files)
    return config


def read_config_text(path: str | os.PathLike[str]) -> str:
    """A config file's text, or a ConfigError naming the file and why it cannot be read."""
    file = Path(path)
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        reason = "file does not exist"
    except IsADirectoryError:
        reason = "is a directory, not a file"
    except PermissionError:
        reason = "permission denied"
    except UnicodeDecodeError as error:
        reason = f"not UTF-8 text: {error.reason}"
    except OSError as error:
        reason = error.strerror or str(error)
    raise ConfigError([ConfigProblem(str(file), "", reason)])


def read_yaml_file(path: str | os.PathLike[str]) -> YamlDocument:
    return read_yaml(read_config_text(path), str(path))


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a config file. Relative paths inside are relative to the file."""
    file = Path(path)
    config = parse_config(read_config_text(file), str(file), file.resolve().parent)
    return replace(config, source=file)


# --- the resolved view that check-config prints ----------------------------------------------


def _policy_dict(policy: Policy) -> dict[str, Any]:
    return {
        "interval": format_duration(policy.interval),
        "deadline": format_duration(policy.deadline),
        "retained_generations": policy.retained_generations,
        "capacity_reserve": policy.capacity_reserve,
        "restore_drill_max_age": format_duration(policy.restore_drill_max_age),
        "layout": policy.layout,
        "watch": policy.watch,
        "poll_interval": format_duration(policy.poll_interval),
        "verify_checksums": policy.verify_checksums,
        "settle": format_duration(policy.settle),
    }


def config_to_dict(config: Config) -> dict[str, Any]:
    """Every setting with defaults filled in, in the file's own notation."""
    return {
        "web": {
            "listen_address": config.web.listen_address,
            "telemetry_path": config.web.telemetry_path,
            "config_file": str(config.web.config_file) if config.web.config_file else None,
        },
        "paths": {k: str(getattr(config.paths, k)) for k in ("procfs", "sysfs", "rootfs")},
        "spool": str(config.spool),
        "spool_retention": format_duration(config.spool_retention),
        "telemetry": {
            "sample_interval": format_duration(config.telemetry.sample_interval),
            "network_devices": config.telemetry.network_devices,
            "infiniband": config.telemetry.infiniband,
            "gpu": config.telemetry.gpu,
            "retention": format_duration(config.telemetry.retention),
        },
        "scan": {
            "metadata_ops_per_second": config.scan.metadata_ops_per_second,
            "reconcile_interval": format_duration(config.scan.reconcile_interval),
            "max_depth": config.scan.max_depth,
            "checksum_bytes_per_second": config.scan.checksum_bytes_per_second,
            "metadata_memory_bytes": config.scan.metadata_memory_bytes,
        },
        "defaults": _policy_dict(config.defaults),
        "jobs": [
            {
                "name": job.name,
                "path": str(job.path),
                "staging": str(job.staging) if job.staging else None,
                **_policy_dict(job.policy),
            }
            for job in config.jobs
        ],
        "discover": [
            {
                "root": str(entry.root),
                "max_jobs": entry.max_jobs,
                "forget_after": format_duration(entry.forget_after),
                **_policy_dict(entry.policy),
            }
            for entry in config.discover
        ],
    }
