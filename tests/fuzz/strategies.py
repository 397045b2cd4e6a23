"""Hypothesis strategies that produce hostile input for each target in targets.py.

Each mixes three sources: grammar-shaped input that gets deep into the reader (pickle opcodes,
checkpoint trees, event records, config documents), mutations of the committed corpus, and raw
bytes.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import yaml
from hypothesis import strategies as st

from checkpoint_exporter.instrument import EVENTS

CORPUS = Path(__file__).resolve().parent / "corpus"


def corpus(target: str) -> list[bytes]:
    directory = CORPUS / target
    return [path.read_bytes() for path in sorted(directory.iterdir())] if directory.is_dir() else []


def _mutate(seed: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    data = bytearray(seed)
    for kind, position, value in edits:
        at = position % (len(data) + 1)
        if kind == "flip" and data:
            data[at % len(data)] ^= 1 << (value % 8)
        elif kind == "set" and data:
            data[at % len(data)] = value
        elif kind == "insert":
            data[at:at] = bytes([value]) * (1 + value % 4)
        elif kind == "delete":
            del data[at : at + 1 + value % 8]
        elif kind == "truncate":
            del data[at:]
    return bytes(data)


def mutations(target: str) -> st.SearchStrategy[bytes]:
    seeds = corpus(target)
    if not seeds:
        return st.nothing()
    edit = st.tuples(
        st.sampled_from(["flip", "set", "insert", "delete", "truncate"]),
        st.integers(0, 1 << 20),
        st.integers(0, 255),
    )
    return st.builds(_mutate, st.sampled_from(seeds), st.lists(edit, max_size=8))


# --- DCP .metadata pickles ------------------------------------------------------------------


def _global(module: str, name: str) -> bytes:
    m, n = module.encode(), name.encode()
    return b"\x8c" + bytes([len(m)]) + m + b"\x8c" + bytes([len(n)]) + n + b"\x93"


_OPCODES = [
    b"(", b"t", b"l", b"d", b"]", b"}", b")", b"e", b"u", b"a", b"s", b"0", b"1", b"2", b"N",
    b"\x88", b"\x89", b"K\x05", b"M\xff\xff", b"J\xff\xff\xff\x7f", b"\x8a\x01\x01",
    b"\x8a\x08" + b"\xff" * 8, b"X\x03\x00\x00\x00abc", b"\x8c\x03../", b"\x8c\x01/",
    b"\x8c\x0e__0_0.distcp", b"C\x02hi", b"\x94", b"h\x00", b"h\x05", b"j\x00\x00\x00\x00",
    b"q\x00", b"\x85", b"\x86", b"\x87", b"R", b"\x81", b"\x92", b"b", b"\x8f", b"\x90",
    b"\x91", b"P0\n", b"Q", b"I1\n", b"I99999999999999999999999\n", b"L" + b"9" * 50 + b"L\n",
    b"F1e308\n", b"G\x7f\xf0\x00\x00\x00\x00\x00\x00", b"\x8d" + (2**40).to_bytes(8, "little"),
    b"B\xff\xff\xff\x7f", b"\x95\x10\x00\x00\x00\x00\x00\x00\x00",
    _global("torch.distributed.checkpoint.metadata", "Metadata"),
    _global("torch.distributed.checkpoint.metadata", "MetadataIndex"),
    _global("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
    _global("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
    _global("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    _global("torch", "Size"), _global("torch", "float32"), _global("collections", "OrderedDict"),
    _global("os", "system"), _global("builtins", "eval"), _global("builtins", "getattr"),
    _global("posix", "system"), _global("subprocess", "Popen"), _global("torch", "load"),
    _global("torch.distributed.checkpoint.metadata", "__builtins__"),
]  # fmt: skip


def pickles() -> st.SearchStrategy[bytes]:
    grammar = st.lists(st.sampled_from(_OPCODES), max_size=80).map(
        lambda parts: b"\x80\x04" + b"".join(parts) + b"."
    )
    return st.one_of(grammar, mutations("dcp_metadata"), st.binary(max_size=1024))


# One-byte opcodes that each make an object (and MEMOIZE, which keeps one alive): the ways a
# small pickle asks for a large heap.
_AMPLIFIERS = [b"}", b"]", b"\x8f", b"}\x94", b"]\x94", b"(", b"N\x94", b"\x88"]


def amplifying_pickles() -> st.SearchStrategy[bytes]:
    """Allocation bombs: one object-making opcode repeated up to a million times, alone or
    mixed, optionally under a real Metadata global so the reader gets as far as it can."""
    run = st.tuples(st.sampled_from(_AMPLIFIERS), st.integers(1, 1 << 20))
    body = st.lists(run, min_size=1, max_size=3).map(
        lambda runs: b"".join(opcode * count for opcode, count in runs)
    )
    prefix = st.sampled_from([b"", _global("torch.distributed.checkpoint.metadata", "Metadata")])
    return st.builds(lambda head, middle: b"\x80\x04" + head + middle + b".", prefix, body)


# --- checkpoint trees -----------------------------------------------------------------------

_NAMES = [
    "step-1", "step-20", "step-", "step-99999999999999999999999999", "iter_0000100", "iter_",
    "global_step7", "global_step", "checkpoint-5", "tmp-checkpoint-3", "checkpoint-5-unfinished",
    "latest", "latest_checkpointed_iteration.txt", ".metadata", ".metadata.tmp", "__0_0.distcp",
    "__1_0.distcp", "__0_0.distcp.tmp", "trainer_state.json", "checkpoint-is-incomplete.txt",
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "last.ckpt",
    "epoch=1-step=10.ckpt", "commit_success.txt", "_CHECKPOINT_METADATA", "5", "0", "-1",
    "step_5.orbax-checkpoint-tmp-123", "mp_rank_00", "mp_rank_00_000", "model_optim_rng.pt",
    "integrity.json", "checkpoint", "weights", "common.pt", "metadata.json", "zero_to_fp32.py",
    "mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
    "checkpoints", "checkpoint_3", "random_states_0.pkl", "optimizer.bin", "optimizer_0",
    "custom_checkpoint_0.pkl", "step_5", ".tmpYIzjdP",
    "checkpoint_manager_snapshot.json", ".validate_storage_marker",
    "checkpoint_2026-12-02_12-53-14.739337", "hang_detector",
    "e\u0301", "\n", " ", "0" * 300, "\udcff",
]  # fmt: skip
_CONTENTS = [
    b"global_step7", b"../../etc", b"/etc/passwd", b"100", b"-5", b"release", b"9" * 5000,
    b"step-1\n", b"", b"\x00\xff", b'{"global_step": 5}', b'{"global_step": -1e400}',
    b'{"log_history": [[[[[]]]]]}', b"[" * 100000 + b"]" * 100000,
    b'{"init_timestamp_nsecs": 1e400, "commit_timestamp_nsecs": -1}',
    b'{"commit_timestamp_nsecs": "soon"}', b'{"weight_map": {"a": "../../x"}}',
    b'{"weight_map": {"a": "/etc/passwd"}}', b'{"files": {"../../etc/shadow": "00"}}',
    b'{"metadata": {"total_size": -5}, "weight_map": null}', b"\xef\xbb\xbf{}",
    b'{"sha256": {"model.safetensors": "abc"}}',
    b'{"checkpoint_results": [{"checkpoint_dir_name": "../../etc", "metrics": {"step": 1e400}}],'
    b' "latest_checkpoint_result": {"checkpoint_dir_name": "../../etc"}}',
    b'{"checkpoint_results": [{"checkpoint_dir_name": "5", "metrics": {"step": -1}}, 7, null],'
    b' "latest_checkpoint_result": {"checkpoint_dir_name": ["5"]}}',
]  # fmt: skip

_name = st.one_of(
    st.sampled_from(_NAMES),
    st.text(min_size=1, max_size=24).filter(lambda n: "/" not in n and "\0" not in n),
).filter(lambda n: n not in (".", ".."))
_mtime = st.one_of(st.floats(1.6e9, 1.8e9), st.floats(-1e10, 1e11, allow_nan=False))
_content = st.one_of(st.none(), st.sampled_from(_CONTENTS), st.binary(max_size=256)).map(
    lambda data: None if data is None else base64.b64encode(data).decode()
)
_file = st.tuples(st.just("f"), st.integers(0, 2**62), _mtime, _content).map(list)
_other = st.sampled_from([["l"], ["o"]])


def _directory(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.tuples(st.just("d"), _mtime, st.dictionaries(_name, children, max_size=6)).map(list)


_tree = _directory(st.recursive(st.one_of(_file, _other), _directory, max_leaves=40))


def trees() -> st.SearchStrategy[bytes]:
    return st.one_of(_tree.map(lambda spec: json.dumps(spec).encode()), mutations("layouts"))


# --- spool event lines ----------------------------------------------------------------------

_anything = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
# Timestamps at the edges: finite floats whose differences are not, year 9999, just inside
# and just outside the reader's window around its clock (1.8e9 in the spool target).
_EDGE_TIMES = [
    1e308, -1e308, 5e-324, 253402300799.0, 1.8e9, 1.8e9 + 299, 1.8e9 + 301, 1.8e9 - 1,
    1.8e9 - 366 * 86400 - 1, 2.0**63, -(2.0**63),
]  # fmt: skip
_number = st.one_of(
    st.integers(-(10**30), 10**30), st.floats(), st.just(10**400), st.just(-(10**400)),
    st.sampled_from([0, 1, -1, True, None, "1", 1.7e9]), st.sampled_from(_EDGE_TIMES),
)  # fmt: skip
_record = st.fixed_dictionaries(
    {},
    optional={
        "v": st.sampled_from([1, 2, "1", None, True, 1.0]),
        "training_job": st.sampled_from(["job", "other", "", None, 5]),
        "event": st.one_of(st.sampled_from(EVENTS), st.text(max_size=10), st.none()),
        "ts": _number, "step": _number, "rank": _number, "world_size": _number, "bytes": _number,
        "host": st.one_of(st.text(max_size=300), _anything),
        "path": st.one_of(st.text(max_size=50), _anything),
        "error": st.one_of(st.text(max_size=2000), _anything),
        "extra": _anything,
    },
)  # fmt: skip


def _line(record: dict) -> bytes:
    return json.dumps(record).encode()  # NaN and Infinity too, as Python's json writes them


def _flood(kind: str, count: int, ts: float) -> bytes:
    """Many valid events of one job: distinct steps, distinct ranks, or one step's errors."""
    lines = []
    for n in range(count):
        record = {
            "v": 1, "ts": ts, "event": "save_start", "training_job": "job", "step": n, "rank": 0,
            "world_size": 1, "host": "h", "path": None, "bytes": None, "error": None,
        }  # fmt: skip
        if kind == "ranks":
            record.update(step=1, rank=n)
        elif kind == "errors":
            record.update(step=1, event="save_failed", error="e" * 100)
        elif kind == "restores":
            record.update(event="restore_start", host=f"h{n}")
        lines.append(json.dumps(record).encode())
    return b"\n".join(lines) + b"\n"


def spool_files() -> st.SearchStrategy[bytes]:
    line = st.one_of(
        _record.map(_line), st.binary(max_size=100), st.sampled_from([b"[" * 70000, b"{" * 5000])
    )
    lines = st.lists(line, max_size=20).map(lambda ls: b"\n".join(ls))
    torn = st.tuples(lines, st.booleans()).map(lambda x: x[0] + (b"\n" if x[1] else b""))
    floods = st.builds(
        _flood,
        st.sampled_from(["steps", "ranks", "errors", "restores"]),
        st.integers(0, 600),
        st.sampled_from([1.8e9, *_EDGE_TIMES]),
    )
    # Over-long lines with and without their newline, blank ones, and many cheap lines.
    long_lines = st.tuples(
        st.sampled_from([b"x", b" ", b"\xff"]), st.integers(65_000, 140_000), st.booleans()
    ).map(lambda x: x[0] * x[1] + (b"\n" if x[2] else b""))
    cheap = st.integers(0, 5_000).map(lambda n: b"{}\n" * n)
    pieces = st.lists(st.one_of(torn, floods, long_lines, cheap), min_size=1, max_size=3)
    return st.one_of(torn, mutations("spool"), pieces.map(b"".join))


# --- config files ---------------------------------------------------------------------------

_CONFIG_KEYS = [
    "web", "listen_address", "telemetry_path", "config_file", "paths", "procfs", "sysfs",
    "rootfs", "spool", "spool_retention", "telemetry", "sample_interval", "network_devices",
    "infiniband", "gpu", "retention", "scan", "reconcile_interval", "metadata_ops_per_second",
    "max_depth", "checksum_bytes_per_second", "defaults", "interval", "deadline", "layout",
    "watch", "poll_interval", "retained_generations", "restore_drill_max_age",
    "capacity_reserve", "verify_checksums", "jobs", "name", "path", "staging", "discover",
    "root", "max_jobs", "forget_after", "<<", "tls_server_config", "cert_file", "key_file",
    "client_auth_type", "client_ca_file", "min_version", "basic_auth_users",
    "http_server_config", "headers",
]  # fmt: skip
_SCALARS = [
    "5s", "1h", "-1s", "0", "0s", "1e9d", "1.5m", "15 minutes", "auto", "inotify", "poll", "dcp",
    "megatron", "on", "off", "yes", "~", "/", "/tmp", ".", "..", "../../etc", "relative",
    ":25780", "[::1]:0", "localhost:99999", "0.0.0.0:0", "^(eth", "(a+)+$", "TLS13", "TLS99",
    "RequireAndVerifyClientCert", "RequestClientCert", "$2y$04$abcdefghijklmnopqrstuv",
]  # fmt: skip
_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(),
    st.sampled_from(_SCALARS), st.text(max_size=10),
)  # fmt: skip
_config_key = st.one_of(st.sampled_from(_CONFIG_KEYS), st.text(max_size=6))
_document = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(_config_key, inner, max_size=6)
    ),
    max_leaves=40,
)


def _dump(document: object) -> bytes:
    return yaml.safe_dump(document, allow_unicode=True).encode()


def configs(target: str) -> st.SearchStrategy[bytes]:
    shaped = st.dictionaries(st.sampled_from(_CONFIG_KEYS), _document, max_size=8).map(_dump)
    return st.one_of(shaped, _document.map(_dump), mutations(target), st.binary(max_size=300))
