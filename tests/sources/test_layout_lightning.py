"""Lightning ``ModelCheckpoint`` (2.6.6): the layout, the step read inside a ``.ckpt``, fuzzing.

The trees are listings the real library left (names, kinds and sizes captured from Lightning
2.6.6 through tests/writers/drivers/lightning_writer.py: ``save`` three times, and ``hang`` with the
temporary directory on a tmpfs). Where a check reads a file, its bytes are a real Lightning
checkpoint (``_REAL_LAST_CKPT``), never a hand-made imitation.
"""

from __future__ import annotations

import base64
import io
import os
import pickle
import struct
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint_exporter.model import WRITING
from checkpoint_exporter.sources import ckpt_step
from checkpoint_exporter.sources.layouts.base import DCP, ZIP, ZIP_STEP, Check
from checkpoint_exporter.sources.validate import BAD_ZIP, MISSING_SHARD, Verdict, validate
from tests.helpers.trees import BASE, build, scan

# ``last.ckpt`` as Lightning 2.6.6 wrote it (torch 2.13.0+cpu, zlib-compressed, base64):
# ModelCheckpoint(every_n_train_steps=7, save_top_k=1, save_last=True) on a LightningModule of
# one torch.nn.Linear(2, 2) with SGD, Trainer(accelerator="cpu", max_steps=7): global_step 7.
_REAL_LAST_CKPT = (
    "eNqlV0lz3EQU1jjO2J7EjhNIQgKEsMVjkozH69hZYQITYMBxzKYEjOiR2iNhzUhPajk4oSEQEjD7XgVFUVD8CJYi"
    "uXEJJ64UB6o4caAoCooDHOB1azyWFNthUZVL00/9fe/r9173a0+UV7UqSnu7csnTrWxQiKeb1iztMwgjOXfGLhW7"
    "lOOx53QLByWrrkYAdR3dhFRZUdfgqGo7FWJrPqMutJTb1C1oc+eYg4y7batqsrpVr2qz1PMtpw6rJMNAbiQ3Aq1q"
    "Bn/7jDCqGZbOYLWuO7ZNdYYz/cwRz6AeNW7HLxlI905CW1ZdiwCbzFEvd4IKbmjXpaecFjDL9jOaRyuBZRsao3Xf"
    "8bTZgQx0ZLNqm3TkeKRKIRNCMiXbIey+0JiBNWoK5+RhrboK37obQGe5lUHX0bJSbim3nIN1+Eqdg+55U2hZz2DD"
    "JFwhVxAKqljEhytN9GZmzJCtHzaaneUWBpsky1nYXE6dhatChi0Mtk7C1QGHa9QOnKzVKCMi/nCt/L4tq4rswHUc"
    "tkv9CyG8vpzyZRSlX7iBw42msAV+JTQ7juvDTRxuzqoi3dMW04QNdnDoyZqrOWTVjQtplF9ykRz0crhFftYqhOkm"
    "9TVmEibT61IDdpbTvkxxBC0naq7nVD3q+7CLw+6wUJjDiA05Dn3h2KPEmIM8FolYsO7UXJsyJO0vpxsZIp4YDzRm"
    "IKWOjGgZLLcFcooeeB6tMxjiMJw1kcpEsIkAU07pxCmWr9nEZ6F+GJkP1GsTq8VlGYFNvUXNBQ6jWROVjglSBUmV"
    "wEQfexaHgborTkMC5tQIs3TNcZlVs04SUbfRWO7lsE/N/yOUHCzq2c/hgAxBYxLm+SCHW7NqqwwTbrXbOBSl4kML"
    "YWiTim9fHAaSAbGOVvWIAXdwKEnI4eYcETkJuzNuCgJf7Y0Lr5F6gPt8ubXexeFudeDykHChYgmLqy1zuEcKuzce"
    "/fFo9LfFuWeROFm7RzhMqDcsMy9RpUc5TEqf9zWd4MoVLKPQ9/1LmEUtdTXpm1QPcHhQUj0kMKkGJtWkUi81B2Gp"
    "ojjLEPLl/jzG4bjcnw9LLwnBj3CYkl4eXVqwtrTgsAgY9RuHwGMciHRSMZFRl4zG0ox0Oca1cm9SEfOQdJpDVZKa"
    "gtSSpI8vTTpzqTloiNSJbVeIPuODzaGmnkLTvY5B7UMm1Wdcx6qzUz01p27hkd2zZ/u4U6e7tqPBoDjqqVn1HhxS"
    "PCXntLrGPGLVZZn5+LUQ+SKTJ4x5NIbTsCKphvTUw4Q0qDnUOThh52g4BXdc7RaJEcEUfrHr6Y5HAcbVdXG7S5gJ"
    "nnojWvtYze2zWZ9O3D4nYH3S//78bqFtfyGHK2Pgy2ponG0NUjYufRuWJ8kC6SJBBrMSKB3PhK59OMHhCfUKNM8w"
    "U0tqmjOvk7EW33CxAYWTsZY1AKewZaUYPIktq7c3bFWcwVOT8LRUII/WCOFp2Q2SixSzwqU9gydJd/Qg0+SG9eHZ"
    "KTjD4bmwM0gbnOVwLiwu4pEaHlpOgJ3s+Sl4gcN8Vm0R7j148fDBz98Tz/uyvdWcGgYtqMFLeCERSzNIzaXi0gEv"
    "o0XQhXcFzaA6mYNX0ChwdYwMHo2z8Op8yEOekALhtXkZ+GlMAsEG8vq43I2GNT1NRXosUrEpvDEvdU8Hoju9Oa6m"
    "F1T78NYUvJ3Ffp+iAQmITJCNq15oOj68MwXvBrmJclv7se8Lvx9FzeJvYtkL2mblluYFLYeysH0s3KdKxR2Je9py"
    "T7/w9+nP350RWRZ/y/vbqhQW/TVuTRqeVNW6iHSpOPgPXcaekSEh4OAJ+FGksWVFAeuVg00BlTlGHXETLBX3/he/"
    "C49tMWZToeHs/h+2iHSlV9TQpRyI3Yr78qXinv8hIHP8hS+P/Hb/gY6Ln1z41TUuCCXn01//2S1v4CsrGYor6S8V"
    "8/9aybf7fjlf+6D1gPBbvfjToHDUfhm/++J+B0rF0f8cAUU5/bTw/cdO/q24xLSu6HtdpAKapf6/8j+YEd6/+bD6"
    "wOXrb5sysLgB5NJ96lm4A8I7jGYZpWLuX4rJjw6NDY2Ojg4VxkaG80OjhcHhfH9+eGx4eKxQ6MdfQyMj/WOFQaHy"
    "8BdfvZxFHVmpMiXENnVGj4zuS5Qn/49LoqMHwOYY8uMOZblDJkkS3cRb4xs3o6xwciR5ohtxfYznzQhP8wBIwqO7"
    "pysG37RGSezdJDa6A+LYj5LY/iQ2WsFx7FVrE9iBJDZaf+ti2Lcj2GXiHi2LbTHwhk7lMgU7UU6ndy2U96rdTWRH"
    "4n24JXx/1hm+ESeaofJXQ23YOVanQ0yHnB/O/RuNbXm6"
)
REAL = zlib.decompress(base64.b64decode(_REAL_LAST_CKPT))
REAL_STEP = 7

# What the real runs left (tests/writers/test_lightning.py's scenarios), sizes as written.
TOP_K_AND_LAST = {  # save_top_k=2, monitor improving, save_last=True: after steps 3, 6, 9
    "epoch=0-step=6.ckpt": 206637,
    "epoch=0-step=9.ckpt": 206637,
    "last.ckpt": 206637,
}
LINK = {  # save_last="link": the same saves, last.ckpt a relative symlink
    "epoch=0-step=6.ckpt": 206637,
    "epoch=0-step=9.ckpt": 206637,
    "last.ckpt": "->epoch=0-step=9.ckpt",
}
NEVER_RANKS = {"epoch=0-step=3.ckpt": 206320, "last.ckpt": 206320}  # top-1, constant score
HALF_COPIED = {  # $TMPDIR on a tmpfs, killed in shutil.move's copy of step 9
    "epoch=0-step=3.ckpt": 206509,
    "epoch=0-step=6.ckpt": 206637,
    "epoch=0-step=9.ckpt": 103318,
    "last.ckpt": 206637,
}


def kinds(found: dict) -> dict[str, list[str]]:
    return {gen_id: [check.kind for check in gen.checks] for gen_id, gen in found.items()}


# --- the layout -------------------------------------------------------------------------------


def test_every_ckpt_file_settles_and_full_last_is_its_own_generation(tmp_path: Path) -> None:
    build(tmp_path, TOP_K_AND_LAST, BASE)
    layout, found = scan(tmp_path)
    assert layout == "lightning"
    assert set(found) == set(TOP_K_AND_LAST)
    # No marker: a cross-filesystem move grows the final name in place.
    assert all(gen.state == WRITING and gen.settles for gen in found.values())
    assert {gen_id: gen.step for gen_id, gen in found.items()} == {
        "epoch=0-step=6.ckpt": 6,
        "epoch=0-step=9.ckpt": 9,
        "last.ckpt": None,  # only inside the file: the zip_step check reads it
    }
    assert kinds(found) == {
        "epoch=0-step=6.ckpt": [ZIP],
        "epoch=0-step=9.ckpt": [ZIP],
        "last.ckpt": [ZIP_STEP],
    }
    # A full last.ckpt is a save of its own: counted as a generation AND by its bytes, even
    # with the same step as epoch=0-step=9.ckpt.
    last = found["last.ckpt"]
    assert (last.bytes, last.files) == (206637, 1)
    assert sum(gen.bytes for gen in found.values()) == sum(TOP_K_AND_LAST.values())


def test_a_link_last_is_no_generation(tmp_path: Path) -> None:
    build(tmp_path, LINK, BASE)
    _, found = scan(tmp_path)
    assert set(found) == {"epoch=0-step=6.ckpt", "epoch=0-step=9.ckpt"}


def test_top_k_that_keeps_nothing_new_leaves_only_last_changing(tmp_path: Path) -> None:
    build(tmp_path, NEVER_RANKS, BASE)
    _, found = scan(tmp_path)
    assert {gen_id: gen.step for gen_id, gen in found.items()} == {
        "epoch=0-step=3.ckpt": 3,
        "last.ckpt": None,
    }
    assert kinds(found)["last.ckpt"] == [ZIP_STEP]


def test_names_with_versions_and_templates_without_a_step(tmp_path: Path) -> None:
    build(
        tmp_path,
        {
            "epoch=0-step=9-v1.ckpt": 8,  # the name existed (a resumed run)
            "last-v1.ckpt": 8,  # another run's last.ckpt was there
            "epoch=4-val_loss=0.12.ckpt": 8,  # filename="{epoch}-{val_loss:.2f}"
            "global_step=5.ckpt": 8,  # a logged metric, not Lightning's {step}
            "notes.txt": 3,
        },
        BASE,
    )
    _, found = scan(tmp_path)
    assert {gen_id: gen.step for gen_id, gen in found.items()} == {
        "epoch=0-step=9-v1.ckpt": 9,
        "last-v1.ckpt": None,
        "epoch=4-val_loss=0.12.ckpt": None,
        "global_step=5.ckpt": None,
    }
    assert kinds(found)["epoch=4-val_loss=0.12.ckpt"] == [ZIP_STEP]


def test_sharded_directories_settle_after_meta_pt(tmp_path: Path) -> None:
    # FSDPStrategy.save_checkpoint's order (the real one runs in tests/writers/test_lightning.py):
    # the DCP save, then rank 0's torch.save of meta.pt in place; here also the saves cut short.
    build(tmp_path, {"epoch=0-step=5.ckpt/__0_0.distcp": 8, "epoch=0-step=5.ckpt/.metadata": 2})
    build(tmp_path, {"epoch=0-step=5.ckpt/meta.pt": 4})
    build(tmp_path, {"last.ckpt/__0_0.distcp": 8, "last.ckpt/.metadata": 2, "last.ckpt/meta.pt": 4})
    build(tmp_path, {"epoch=1-step=10.ckpt/__0_0.distcp": 8, "epoch=1-step=10.ckpt/.metadata": 2})
    build(tmp_path, {"epoch=2-step=15.ckpt/__0_0.distcp": 8, "epoch=2-step=15.ckpt/meta.pt": 4})
    _, found = scan(tmp_path)
    assert {gen_id: gen.settles for gen_id, gen in found.items()} == {
        "epoch=0-step=5.ckpt": True,
        "last.ckpt": True,
        "epoch=1-step=10.ckpt": False,  # meta.pt not yet: writing, the deadline judges it
        "epoch=2-step=15.ckpt": False,  # the DCP save never committed
    }
    assert all(gen.state == WRITING for gen in found.values())
    assert kinds(found)["epoch=0-step=5.ckpt"] == [DCP, ZIP]
    assert [c.path for c in found["last.ckpt"].checks] == ["last.ckpt", "last.ckpt/meta.pt"]
    assert kinds(found)["last.ckpt"] == [DCP, ZIP_STEP]


# --- validation: the zip check, and the step inside -----------------------------------------


def verdicts(root: Path) -> dict[str, Verdict]:
    _, found = scan(root)
    return {gen_id: validate(str(root), gen.checks) for gen_id, gen in found.items()}


def test_real_checkpoint_gives_its_step_and_a_half_copy_aborts(tmp_path: Path) -> None:
    half = HALF_COPIED["epoch=0-step=9.ckpt"] / HALF_COPIED["last.ckpt"]
    build(
        tmp_path,
        {
            "epoch=0-step=7.ckpt": REAL,
            "last.ckpt": REAL,
            "epoch=0-step=14.ckpt": REAL[: int(len(REAL) * half)],  # cut where the copy stopped
        },
        BASE,
    )
    got = verdicts(tmp_path)
    assert got["epoch=0-step=7.ckpt"] == Verdict(True)  # the name says the step
    assert got["last.ckpt"] == Verdict(True, step=REAL_STEP)
    assert not got["epoch=0-step=14.ckpt"].valid
    assert got["epoch=0-step=14.ckpt"].reason == BAD_ZIP


def test_zip_step_check_of_missing_and_non_zip_files(tmp_path: Path) -> None:
    build(tmp_path, {"last.ckpt": b"not a zip at all"})
    assert validate(str(tmp_path), [Check(ZIP_STEP, "last.ckpt")]).reason == BAD_ZIP
    assert validate(str(tmp_path), [Check(ZIP_STEP, "gone.ckpt")]).reason == MISSING_SHARD
    # A zip without data.pkl is a valid zip whose step is unknown.
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/version", b"3")
    build(tmp_path, {"other.ckpt": buffer.getvalue()})
    assert validate(str(tmp_path), [Check(ZIP_STEP, "other.ckpt")]) == Verdict(True)


# --- ckpt_step ---------------------------------------------------------------------------------


@contextmanager
def memory_file(data: bytes) -> Iterator[int]:
    fd = os.memfd_create("ckpt")
    try:
        os.write(fd, data)
        yield fd
    finally:
        os.close(fd)


def step_of(data: bytes) -> int | None:
    with memory_file(data) as fd:
        return ckpt_step.step_in(fd, len(data))


def torch_like_zip(
    payload: object | bytes, protocol: int = 2, method: int = zipfile.ZIP_STORED
) -> bytes:
    """A zip laid out as torch.save's: ``archive/data.pkl`` first, then the records."""
    data = payload if isinstance(payload, bytes) else pickle.dumps(payload, protocol=protocol)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=method) as archive:
        archive.writestr("archive/data.pkl", data)
        archive.writestr("archive/data/0", b"\0" * 64)
        archive.writestr("archive/version", b"3\n")
    return buffer.getvalue()


def test_reads_the_step_of_a_real_lightning_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "last.ckpt").write_bytes(REAL)
    assert ckpt_step.read_step(tmp_path / "last.ckpt") == REAL_STEP
    assert ckpt_step.read_step(tmp_path / "absent.ckpt") is None
    (tmp_path / "link.ckpt").symlink_to("last.ckpt")
    assert ckpt_step.read_step(tmp_path / "link.ckpt") is None  # never through a symlink


def test_every_cut_of_a_real_checkpoint_is_unknown() -> None:
    for cut in range(0, len(REAL), 29):
        assert step_of(REAL[:cut]) is None, cut


def test_only_the_top_level_key_counts() -> None:
    inner = {"global_step": 1}
    assert step_of(torch_like_zip({"epoch": 0, "global_step": 5})) == 5
    # The key string memoized inside a nested dict, then fetched (BINGET) for the top level.
    assert step_of(torch_like_zip({"loops": inner, "global_step": 5})) == 5
    assert step_of(torch_like_zip({"loops": inner, "epoch": 2})) is None
    assert step_of(torch_like_zip({"a": [inner, {"b": {"global_step": 3}}], "c": 1})) is None
    assert step_of(torch_like_zip({"global_step": 2**40})) == 2**40
    assert step_of(torch_like_zip({"global_step": True})) is None  # a bool is no step
    assert step_of(torch_like_zip({"global_step": -1})) is None
    assert step_of(torch_like_zip({"global_step": "7"})) is None
    assert step_of(torch_like_zip([("global_step", 5)])) is None  # not a dict
    # An int on the stack right after the key may still open a nested tuple.
    assert step_of(torch_like_zip({"global_step": (5, "x", "y")})) is None
    assert step_of(torch_like_zip({"global_step": (5, ("a", "b", "c")), "epoch": 1})) is None
    assert step_of(torch_like_zip({"a": ("global_step", 5), "b": 1})) is None
    assert step_of(torch_like_zip({("global_step", 5): 1})) is None
    # Past pickle's batches of 1000 items (several SETITEMS on the top-level dict).
    big = {f"k{i}": i for i in range(2500)} | {"global_step": 77}
    assert step_of(torch_like_zip(big)) == 77


@pytest.mark.parametrize("protocol", [1, 2, 3, 4, 5])
def test_every_pickle_protocol_with_an_empty_dict(protocol: int) -> None:
    checkpoint = {"epoch": 1, "loops": {"global_step": 3, "x": [1, 2]}, "global_step": 9}
    assert step_of(torch_like_zip(checkpoint, protocol)) == 9


def test_what_it_will_not_read() -> None:
    assert step_of(torch_like_zip(pickle.dumps({"global_step": 4}, protocol=0))) is None
    assert step_of(torch_like_zip({"global_step": 4}, method=zipfile.ZIP_DEFLATED)) is None
    assert step_of(b"") is None
    assert step_of(b"PK\x05\x06" + b"\0" * 18) is None  # an empty zip


def test_zip64_end_records(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch writes ZIP64 end records past 4 GiB or 65,535 records; zipfile does the same once
    # its limit is low.
    monkeypatch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 2)
    written = torch_like_zip({"epoch": 0, "global_step": 12})
    assert b"PK\x06\x06" in written and b"PK\x06\x07" in written
    # The classic end record saturated, as when the values do not fit: only ZIP64 tells.
    end = written.rfind(b"PK\x05\x06")
    saturated = struct.pack("<HHHHII", 0xFFFF, 0xFFFF, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    data = written[: end + 4] + saturated + written[end + 20 :]
    assert step_of(written) == step_of(data) == 12
    # A locator pointing anywhere but a ZIP64 end record: unknown.
    locator = data.rfind(b"PK\x06\x07")
    broken = data[: locator + 8] + struct.pack("<Q", 3) + data[locator + 16 :]
    assert step_of(broken) is None


def test_reads_are_bounded() -> None:
    reads: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, count: int, offset: int) -> bytes:
        reads.append(count)
        return real_pread(fd, count, offset)

    small = torch_like_zip({"global_step": 3, "blob": b"\0" * 1024})
    big = torch_like_zip({"global_step": 3, "blob": b"\0" * ckpt_step.PICKLE_BYTES})
    with memory_file(small) as small_fd, memory_file(big) as big_fd:
        ckpt_step.os.pread = counting_pread  # type: ignore[assignment]
        try:
            assert ckpt_step.step_in(small_fd, len(small)) == 3
            assert sum(reads) <= 2 * len(small)
            reads.clear()
            assert ckpt_step.step_in(big_fd, len(big)) is None  # data.pkl too big to read
        finally:
            ckpt_step.os.pread = real_pread  # type: ignore[assignment]
    assert sum(reads) < ckpt_step.TAIL_BYTES + ckpt_step.DIRECTORY_BYTES + 4096


def test_opcode_budget_bounds_a_hostile_pickle() -> None:
    # A million opcodes that never reach a key, then a budget far smaller than the pickle.
    hostile = b"\x80\x02}q\x00(" + b"N0" * 500_000 + b"X\x0b\x00\x00\x00global_stepK\x05u."
    assert ckpt_step.pickle_step(hostile) == 5
    assert ckpt_step.pickle_step(hostile, opcodes=1000) is None


# --- fuzzing: nothing escapes, nothing hangs ---------------------------------------------------

fuzz = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def bounded_step(data: bytes) -> int | None:
    # Bounded by the reader's byte and opcode budgets (the tests above); a hang would fail the
    # suite's per-test timeout.
    step = step_of(data)
    assert step is None or (isinstance(step, int) and step >= 0)
    return step


@fuzz
@given(st.binary(max_size=4096))
def test_fuzz_random_bytes(data: bytes) -> None:
    bounded_step(data)
    bounded_step(b"PK\x03\x04" + data + b"PK\x05\x06" + data[-18:])


@fuzz
@given(
    st.lists(st.tuples(st.integers(0, len(REAL) - 1), st.integers(0, 255)), max_size=12),
    st.integers(0, len(REAL)),
    st.binary(max_size=64),
)
def test_fuzz_mutated_real_checkpoint(flips: list[tuple[int, int]], cut: int, tail: bytes) -> None:
    data = bytearray(REAL)
    for position, value in flips:
        data[position] = value
    bounded_step(bytes(data))
    bounded_step(bytes(data[:cut]) + tail)


@fuzz
@given(st.binary(max_size=2048))
def test_fuzz_pickle_bytes_inside_a_good_zip(payload: bytes) -> None:
    bounded_step(torch_like_zip(b"\x80\x02}q\x00(" + payload))
    step = ckpt_step.pickle_step(payload)
    assert step is None or isinstance(step, int)


_VALUES = st.recursive(
    st.integers(-(2**70), 2**70) | st.text(max_size=12) | st.booleans() | st.none(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["global_step", "epoch", "state_dict", "x"]), inner)
    ),
    max_leaves=20,
)


@fuzz
@given(
    st.dictionaries(st.text(max_size=12), _VALUES, max_size=8),
    st.none() | st.integers(-5, 2**40) | st.booleans(),
    st.integers(0, 8),
    st.integers(2, 5),
)
@pytest.mark.slow
def test_fuzz_the_step_is_exactly_the_top_level_one(
    others: dict, step: int | None, position: int, protocol: int
) -> None:
    items = [(k, v) for k, v in others.items() if k != "global_step"]
    if step is not None:
        items.insert(min(position, len(items)), ("global_step", step))
    expected = step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None
    assert bounded_step(torch_like_zip(dict(items), protocol)) == expected
