"""A tenant names files from inside a checkpoint (a DCP shard's ``relative_path``, a safetensors
index's ``weight_map``, an integrity manifest's files) and plants symlinks where they lead.

Every such name is resolved beneath the generation's directory, one component at a time, never
through a symlink: nothing outside is read or sized (no size, no checksum in the verdict or the
log), a link into a hung mount cannot stall validation, and the verdict is the same wherever the
link points (a 0700 directory, one the exporter's user cannot read, a FIFO, nothing)."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from checkpoint_exporter.core.tracker import ValidationRequest
from checkpoint_exporter.daemon.scanner import Validator
from checkpoint_exporter.sources.layouts.base import (
    DCP,
    INTEGRITY,
    SAFETENSORS_INDEX,
    Check,
    Found,
)
from checkpoint_exporter.sources.listing import Dir, OpsBudget, TreeReader
from checkpoint_exporter.sources.validate import MISSING_SHARD, Limits, Verdict, validate
from tests.conftest import as_nobody, as_user_env
from tests.faults.hungfs import hung_mount
from tests.helpers.trees import scan

pytestmark = [pytest.mark.torch]

SECRET = b"s" * 4242
SECRET_SHA = hashlib.sha256(SECRET).hexdigest()
NEEDED = 5000  # what the metadata claims: a followed link would say "is 4242 bytes"
KINDS = ("dcp", "index", "integrity")
NOT_FOLLOWED = "is a symlink: not followed"

_METADATA = r"""
import pickle, sys, warnings
warnings.filterwarnings("ignore")
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, BytesStorageMetadata
from torch.distributed.checkpoint.filesystem import _StorageInfo
paths = pickle.loads(sys.stdin.buffer.read())
items = {f"i{n}": BytesStorageMetadata() for n in range(len(paths))}
storage = {MetadataIndex(f"i{n}"): _StorageInfo(path, 0, size)
           for n, (path, size) in enumerate(paths)}
sys.stdout.buffer.write(pickle.dumps(Metadata(state_dict_metadata=items, storage_data=storage)))
"""


@functools.lru_cache
def metadata_naming(*paths: tuple[str, int]) -> bytes:
    """A real torch DCP ``.metadata`` whose shards are ``paths`` (relative path, bytes)."""
    return subprocess.run(
        [sys.executable, "-c", _METADATA], input=pickle.dumps(paths),
        capture_output=True, check=True, timeout=300,
    ).stdout  # fmt: skip


def plant(generation: Path, kind: str, name: str) -> None:
    """A generation whose own files are whole, and whose ``kind`` of file names ``name``."""
    generation.mkdir(parents=True)
    (generation / "__0_0.distcp").write_bytes(b"\0" * 16)
    if kind == "dcp":
        metadata = metadata_naming(("__0_0.distcp", 16), (name, NEEDED))
        (generation / ".metadata").write_bytes(metadata)
    elif kind == "index":
        weight_map = {"a": "__0_0.distcp", "b": name}
        index = json.dumps({"weight_map": weight_map})
        (generation / "model.safetensors.index.json").write_text(index)
    else:  # the manifest's digest is the outside file's: a followed link would pass
        files = {"__0_0.distcp": hashlib.sha256(b"\0" * 16).hexdigest(), name: SECRET_SHA}
        (generation / "integrity.json").write_text(json.dumps({"files": files}))


def checks(kind: str) -> list[Check]:
    if kind == "dcp":
        return [Check(DCP, "gen")]
    if kind == "index":
        return [Check(SAFETENSORS_INDEX, "gen/model.safetensors.index.json")]
    return [Check(INTEGRITY, "gen")]


def listed(root: Path) -> Dir | None:
    """The tier's listing, as the daemon hands it to the validator with the checks."""
    return TreeReader(root, OpsBudget()).read()[0]


def outside(base: Path, target: str) -> Path:
    """What a link may point at, outside the checkpoint: ``secret`` (a 0700 directory holding
    a 4242-byte file), ``fifo`` (a directory holding a FIFO of that name), ``absent``."""
    directory = base / f"outside-{target}"
    if target == "absent":
        return directory
    directory.mkdir(parents=True)
    if target == "secret":
        (directory / "secret.key").write_bytes(SECRET)
        os.chmod(directory, 0o700)
    else:
        os.mkfifo(directory / "secret.key")
    return directory


# A link where a directory is on the way, and a link where the file itself should be.
LINKS = {
    "lnk/secret.key": lambda target: target,
    "secret.key": lambda target: target / "secret.key",
}


def tree(base: Path, kind: str, name: str, target: str) -> Path:
    root = base / f"{kind}-{name.replace('/', '_')}-{target}"
    plant(root / "gen", kind, name)
    link = root / "gen" / name.split("/")[0]
    link.symlink_to(LINKS[name](outside(root, target)))
    return root


def judged(root: Path, kind: str) -> Verdict:
    return validate(str(root), checks(kind), Limits(checksum_bytes_per_second=0), listed(root))


def assert_not_followed(verdict: Verdict) -> None:
    assert (verdict.valid, verdict.reason) == (False, MISSING_SHARD), verdict
    assert NOT_FOLLOWED in verdict.detail, verdict
    assert "4242" not in verdict.detail and SECRET_SHA not in verdict.detail, verdict


@pytest.mark.parametrize("name", LINKS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_link_named_inside_a_checkpoint_is_never_followed(
    tmp_path: Path, kind: str, name: str
) -> None:
    verdicts = {
        target: judged(tree(tmp_path, kind, name, target), kind)
        for target in ("secret", "fifo", "absent")
    }
    assert_not_followed(verdicts["secret"])
    # Where the link points changes nothing: the validity gauge is no oracle.
    assert verdicts["fifo"] == verdicts["absent"] == verdicts["secret"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_fifo_or_a_directory_where_a_file_should_be_is_no_file(tmp_path: Path, kind: str) -> None:
    for planted in ("fifo", "directory"):
        root = tmp_path / f"{kind}-{planted}"
        plant(root / "gen", kind, "sub/shard")
        (root / "gen" / "sub").mkdir()
        if planted == "fifo":
            os.mkfifo(root / "gen" / "sub" / "shard")
        else:
            (root / "gen" / "sub" / "shard").mkdir()
        verdict = judged(root, kind)
        assert (verdict.valid, verdict.reason) == (False, MISSING_SHARD), verdict
        assert "sub/shard is not a regular file" in verdict.detail, verdict


@pytest.mark.parametrize("kind", KINDS)
def test_a_name_below_a_real_directory_is_still_checked(tmp_path: Path, kind: str) -> None:
    """Resolving beneath is no refusal of subdirectories: a shard there is found, sized and
    (with checksums on) read."""
    root = tmp_path / kind
    plant(root / "gen", kind, "sub/shard")
    (root / "gen" / "sub").mkdir()
    (root / "gen" / "sub" / "shard").write_bytes(SECRET + b"\0" * (NEEDED - len(SECRET)))
    if kind == "integrity":
        (root / "gen" / "sub" / "shard").write_bytes(SECRET)
    assert judged(root, kind) == Verdict(True)
    shard = root / "gen" / "sub" / "shard"
    shard.unlink() if kind == "index" else os.truncate(shard, 10)  # an index asks presence only
    assert not judged(root, kind).valid


def megatron_iteration(root: Path, target: str) -> None:
    """A whole torch_dist iteration whose integrity.json also lists a link into ``target``."""
    iteration = root / "iter_0000010"
    iteration.mkdir(parents=True)
    (iteration / "__0_0.distcp").write_bytes(b"\0" * 16)
    (iteration / ".metadata").write_bytes(metadata_naming(("__0_0.distcp", 16)))
    (iteration / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    files = {"__0_0.distcp": hashlib.sha256(b"\0" * 16).hexdigest(), "lnk/secret.key": SECRET_SHA}
    (iteration / "integrity.json").write_text(json.dumps({"files": files}))
    (iteration / "lnk").symlink_to(outside(root, target))
    (root / "latest_checkpointed_iteration.txt").write_text("10")


@pytest.mark.parametrize("verify_checksums", [False, True])
def test_a_megatron_manifest_link_with_and_without_verify_checksums(
    tmp_path: Path, verify_checksums: bool
) -> None:
    """Without ``verify_checksums`` the manifest is not read at all; with it, its link is
    refused. Either way, the same verdict wherever the link points."""
    verdicts = {}
    for target in ("secret", "fifo", "absent"):
        root = tmp_path / target
        megatron_iteration(root, target)
        _, found = scan(root, "megatron", verify_checksums=verify_checksums)
        checks = found["iter_0000010"].checks
        verdicts[target] = validate(str(root), checks, Limits(checksum_bytes_per_second=0))
    if verify_checksums:
        assert_not_followed(verdicts["secret"])
    else:
        assert verdicts["secret"] == Verdict(True)
    assert verdicts["fifo"] == verdicts["absent"] == verdicts["secret"]


def test_the_daemons_validator_neither_sizes_nor_logs_what_a_link_leads_to(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Through the daemon's own path (a descriptor of the generation, /proc/self/fd): the
    warning names the link, not the size of what it leads to."""
    root = tree(tmp_path, "dcp", "lnk/secret.key", "secret")
    _, found = scan(root, "dcp")
    verdict = validated(root, found["gen"], caplog)
    assert_not_followed(verdict)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert NOT_FOLLOWED in logged and "4242" not in logged


def validated(root: Path, item: Found, caplog: pytest.LogCaptureFixture) -> Verdict:
    request = ValidationRequest("j", "durable", item.id, (item.bytes, item.files, 0.0), item)
    validator = Validator(Limits(checksum_bytes_per_second=0))
    validator.start()
    try:
        with caplog.at_level(logging.WARNING):
            validator.submit(request, str(root), follow_root=False)
            answer = validator.verdicts.get(timeout=120)
    finally:
        validator.stop()
    assert answer[0] is request and answer[1] is not None
    return answer[1]


@pytest.mark.root
@pytest.mark.parametrize("kind", KINDS)
def test_a_link_into_a_hung_mount_does_not_stall_validation(tmp_path: Path, kind: str) -> None:
    """Any lookup below the mount blocks in the kernel until the test ends: a validation that
    returns at all touched nothing there."""
    root = tmp_path / "tree"
    plant(root / "gen", kind, "lnk/secret.key")
    with hung_mount(tmp_path / "hung") as hung:
        (root / "gen" / "lnk").symlink_to(hung)
        listing = listed(root)
        verdicts: list[Verdict] = []
        worker = threading.Thread(
            target=lambda: verdicts.append(
                validate(str(root), checks(kind), Limits(checksum_bytes_per_second=0), listing)
            ),
            daemon=True,
        )
        worker.start()
        worker.join(timeout=120)  # a hang detector, not a speed budget: it returns or never
        hung_meanwhile = worker.is_alive()
    worker.join(timeout=10)  # the mount's end unblocks a hung lookup (ENOTCONN)
    assert not hung_meanwhile, "validation blocked on the hung mount a link leads to"
    assert_not_followed(verdicts[0])


_AS_NOBODY = """
import json, sys
from checkpoint_exporter.sources.layouts.base import DCP, INTEGRITY, SAFETENSORS_INDEX, Check
from checkpoint_exporter.sources.listing import OpsBudget, TreeReader
from checkpoint_exporter.sources.validate import Limits, validate
root, kind = sys.argv[1], sys.argv[2]
listing, _ = TreeReader(root, OpsBudget()).read()
check = {"dcp": Check(DCP, "gen"), "integrity": Check(INTEGRITY, "gen"),
         "index": Check(SAFETENSORS_INDEX, "gen/model.safetensors.index.json")}[kind]
verdict = validate(root, [check], Limits(checksum_bytes_per_second=0), listing)
print(json.dumps([verdict.valid, verdict.reason, verdict.detail]))
"""


@pytest.mark.root
@pytest.mark.parametrize("kind", KINDS)
def test_a_link_into_a_directory_the_exporter_cannot_read_is_judged_like_any_link(
    kind: str,
) -> None:
    """As nobody, a link into root's 0700 directory: not "unreadable, skipped" (a verdict that
    would tell the tenant the directory's permissions), the same verdict as a dangling link."""
    base = Path(tempfile.mkdtemp(prefix="ckpt-beneath-"))
    try:
        os.chmod(base, 0o755)
        verdicts = {}
        for target in ("secret", "absent"):
            root = tree(base, kind, "lnk/secret.key", target)
            subprocess.run(["chmod", "-R", "go+rX", str(root / "gen")], check=True)
            os.chmod(root, 0o755)  # the target directory stays root's, 0700
            reply = subprocess.run(
                [*as_nobody(), sys.executable, "-c", _AS_NOBODY, str(root), kind],
                capture_output=True, text=True, check=True, timeout=120, env=as_user_env(),
            )  # fmt: skip
            verdicts[target] = json.loads(reply.stdout)
        valid, reason, detail = verdicts["secret"]
        assert (valid, reason) == (False, MISSING_SHARD) and NOT_FOLLOWED in detail, verdicts
        assert verdicts["secret"] == verdicts["absent"]
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=True)
