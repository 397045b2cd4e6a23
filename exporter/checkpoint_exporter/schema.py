"""One schema helper for every configuration file: the exporter config, the web config, the mixin
config and the plan inputs.

A reader describes each mapping as a tuple of ``Field`` (key, parser, required, default) and lets
``Problems.check`` do the rest: unknown keys (with "did you mean"), values its parsers refuse,
missing required keys. Every problem is collected, not raised at once, so one edit-and-check
cycle fixes them all; each names the file, the line, the full key path (``jobs[2].deadline``)
and the reason. A parser is a plain function that returns the parsed value or raises ValueError
with the reason.

YAML is read with the safe loader only, keeping each key's line, and the reader refuses language
tags, duplicate keys and alias expansions that blow up in size.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from checkpoint_exporter.units import parse_duration

KeyPath = tuple[str | int, ...]
Parser = Callable[[object], Any]


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


def format_key(path: KeyPath) -> str:
    """``("jobs", 2, "deadline")`` -> ``jobs[2].deadline``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# --- fields and the checker ------------------------------------------------------------------

_NO_DEFAULT: Any = object()


def _as_is(value: object) -> object:
    return value


@dataclass(frozen=True)
class Field:
    """One key of a mapping. ``parse`` returns the value or raises ValueError with the reason;
    a key that is absent (or whose value is refused) takes ``default`` when there is one."""

    key: str
    parse: Parser = _as_is
    required: bool = False
    default: Any = _NO_DEFAULT


class Problems:
    """Every problem found in one file, each placed at the line of its key (or of the nearest
    enclosing key the file has)."""

    def __init__(
        self, file: str, lines: dict[KeyPath, int] | None = None, refused: Iterable[KeyPath] = ()
    ):
        self.file = file
        self.lines = lines or {}
        # Values the YAML reader already refused: their follow-on problems would be noise.
        self.refused = set(refused)
        self.found: list[ConfigProblem] = []

    @classmethod
    def of(cls, file: str, document: YamlDocument) -> Problems:
        """A checker for ``document`` that starts with the problems found reading its YAML."""
        problems = cls(file, document.lines, document.refused)
        problems.found.extend(document.problems)
        return problems

    def add(self, path: KeyPath, reason: str) -> None:
        if any(path[:depth] in self.refused for depth in range(len(path) + 1)):
            return
        line = None
        for depth in range(len(path), -1, -1):
            line = self.lines.get(path[:depth])
            if line is not None:
                break
        self.found.append(ConfigProblem(self.file, format_key(path), reason, line))

    def check(
        self,
        raw: object,
        path: KeyPath,
        fields: Sequence[Field],
        *,
        noun: str = "key",
        list_known: bool = True,
    ) -> dict[str, Any]:
        """The parsed values of mapping ``raw`` (None reads as empty) at ``path``.

        An unknown key ("unknown <noun>", with the closest known key and, if ``list_known``, all
        of them), a value its parser refuses and a missing required key are each reported; the
        value is dropped and checking goes on.
        """
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            self.add(path, f"expected a mapping, got {type_name(raw)}")
            return {}
        by_key = {f.key: f for f in fields}
        values: dict[str, Any] = {}
        for key, value in raw.items():
            spec = by_key.get(key)
            if spec is None:
                hint = did_you_mean(key, by_key)
                if list_known:
                    hint += f" (known keys: {', '.join(sorted(by_key))})"
                self.add((*path, key), f"unknown {noun}{hint}")
                continue
            try:
                values[key] = spec.parse(value)
            except ValueError as error:
                self.add((*path, key), str(error))
        for spec in fields:
            if spec.required and spec.key not in raw:
                self.add(path, f"missing required key {spec.key!r}")
            if spec.key not in values and spec.default is not _NO_DEFAULT:
                values[spec.key] = spec.default
        return values

    def raise_if_any(self) -> None:
        if self.found:
            raise ConfigError(self.found)


def did_you_mean(key: object, options: Iterable[str]) -> str:
    """'; did you mean 'x'?' for the closest option, or nothing when none is close."""
    close = difflib.get_close_matches(str(key), sorted(options), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


# --- value parsers ---------------------------------------------------------------------------


def type_name(value: object) -> str:
    return {dict: "a mapping", list: "a list", type(None): "nothing"}.get(
        type(value), type(value).__name__
    )


def shown(value: object) -> str:
    """``value`` for an error message, cut short: a 5,000-digit number is not worth echoing."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} characters)"


def positive_duration(value: object) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError("must be greater than zero")
    return seconds


def whole_number(minimum: int, maximum: int) -> Parser:
    def parse(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected a whole number, got {type_name(value)} {shown(value)}")
        if value < minimum:
            raise ValueError(f"must be at least {minimum}, got {shown(value)}")
        if value > maximum:
            raise ValueError(f"must be at most {maximum:,}, got {shown(value)}")
        return value

    return parse


def fraction(value: object) -> float:
    """A share of something, in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            f"expected a number between 0 and 1, got {type_name(value)} {shown(value)}"
        )
    if not 0 <= value < 1:
        raise ValueError(
            f"must be at least 0 and below 1 (a share of the space), got {shown(value)}"
        )
    return float(value)


def rate(maximum: float) -> Parser:
    """A non-negative, finite number of at most ``maximum`` (per second; 0 = no limit)."""

    def parse(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {type_name(value)} {shown(value)}")
        # Compared before any conversion: float() of a huge int would itself overflow.
        if isinstance(value, float) and math.isnan(value):
            raise ValueError("expected a number, got nan")
        if value < 0:
            raise ValueError(f"must not be negative, got {shown(value)}")
        if value > maximum:
            raise ValueError(f"must be at most {maximum:g} (0 means no limit), got {shown(value)}")
        return float(value)

    return parse


def choice(options: tuple[str, ...]) -> Parser:
    def parse(value: object) -> str:
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)}; got {value!r}")
        return str(value)

    return parse


def boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def text(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {type_name(value)} {value!r}")
    return value


def regex(value: object) -> str:
    pattern = text(value)
    try:
        re.compile(pattern)
    except re.error as error:
        raise ValueError(f"invalid regular expression {pattern!r}: {error}") from None
    return pattern


# --- YAML with line numbers -----------------------------------------------------------------

# Bounds what a hostile or mistaken file can make the loader build (alias "billion laughs").
_MAX_YAML_NODES = 100_000

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass
class YamlDocument:
    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)  # key path -> line number
    problems: list[ConfigProblem] = field(default_factory=list)
    refused: set[KeyPath] = field(default_factory=set)  # values read as None because refused


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


# What reading one configuration file may cost (the exporter config, at start and on SIGHUP;
# the web config; the mixin config; check-config). A config path is the operator's, but what it
# names may not be a file: a FIFO would block open() for good, /dev/zero would be read until
# memory runs out, a file on a hung mount would never answer.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
CONFIG_READ_SECONDS = 5.0
MAX_HUNG_READS = 4  # reads given up but still stuck in the kernel; then none is tried
_hung = 0
_hung_lock = threading.Lock()

_FILE_TYPES = (
    (stat.S_ISDIR, "is a directory, not a file"),
    (stat.S_ISFIFO, "not a regular file (a FIFO)"),
    (stat.S_ISCHR, "not a regular file (a character device)"),
    (stat.S_ISBLK, "not a regular file (a block device)"),
    (stat.S_ISSOCK, "not a regular file (a socket)"),
)


class _Refused(Exception):
    """The file is there but is not one to read; the message says why."""


def hung_reads() -> int:
    """Reads given up at their deadline and not returned yet."""
    return _hung


def read_config_text(path: str | os.PathLike[str]) -> str:
    """A config file's text, or a ConfigError naming the file and why it cannot be read: not a
    regular file, larger than MAX_CONFIG_BYTES, not UTF-8, or no answer within
    CONFIG_READ_SECONDS (the read is left to its thread; a later read does not wait for it)."""
    global _hung
    file = Path(path)
    outcome: list[str | BaseException] = []
    state = {"done": False, "given_up": False}

    def read() -> None:
        global _hung
        try:
            outcome.append(_read_regular(file, MAX_CONFIG_BYTES))
        except BaseException as error:  # handed to the caller
            outcome.append(error)
        with _hung_lock:
            state["done"] = True
            if state["given_up"]:
                _hung -= 1

    with _hung_lock:
        if _hung >= MAX_HUNG_READS:
            raise _problem(file, f"not read: {_hung} earlier reads of configuration files have "
                           "not returned (a hung mount?)")  # fmt: skip
    reader = threading.Thread(target=read, name="config read", daemon=True)
    reader.start()
    reader.join(CONFIG_READ_SECONDS)
    with _hung_lock:
        if not state["done"]:
            state["given_up"] = True
            _hung += 1
            raise _problem(file, f"did not answer within {CONFIG_READ_SECONDS:g} s (a hung mount?)")
    result = outcome[0]
    if isinstance(result, str):
        return result
    raise _problem(file, _reason(result)) from None


def _read_regular(file: Path, limit: int) -> str:
    """The text of ``file`` if it is a regular file of at most ``limit`` bytes. Symlinks are
    followed (the operator's, as a ConfigMap's); O_NONBLOCK so a FIFO cannot block the open."""
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd)
        for is_type, reason in _FILE_TYPES:
            if is_type(mode.st_mode):
                raise _Refused(reason)
        if not stat.S_ISREG(mode.st_mode):
            raise _Refused("not a regular file")
        too_large = f"larger than {limit // 1024 // 1024} MiB: not a configuration file"
        if mode.st_size > limit:
            raise _Refused(too_large)
        chunks, total = [], 0
        while chunk := os.read(fd, min(1024 * 1024, limit + 1 - total)):
            total += len(chunk)
            if total > limit:  # it grew while read
                raise _Refused(too_large)
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8")


def _reason(error: BaseException) -> str:
    if isinstance(error, _Refused):
        return str(error)
    if isinstance(error, FileNotFoundError):
        return "file does not exist"
    if isinstance(error, PermissionError):
        return "permission denied"
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text: {error.reason}"
    if isinstance(error, OSError):
        return error.strerror or str(error)
    raise error  # not a reading problem: a bug, let it show


def _problem(file: Path, reason: str) -> ConfigError:
    return ConfigError([ConfigProblem(str(file), "", reason)])


def read_yaml_file(path: str | os.PathLike[str]) -> YamlDocument:
    return read_yaml(read_config_text(path), str(path))


def read_mapping_file(path: str | os.PathLike[str]) -> tuple[dict[Any, Any], Problems]:
    """A YAML file that must hold a mapping (empty or unreadable YAML reads as an empty one),
    and a checker that already holds the problems of reading it."""
    document = read_yaml_file(path)
    # Not Problems.of: these readers have always reported the problems under a value the YAML
    # reader refused too, and still do.
    problems = Problems(str(path), document.lines)
    problems.found.extend(document.problems)
    data = document.data or {}
    if not isinstance(data, dict):
        raise ConfigError([*problems.found, ConfigProblem(str(path), "", "expected a mapping")])
    return data, problems
