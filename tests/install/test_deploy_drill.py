"""Where the shipped restore drills run and what they may take: the CronJob on the nodes whose
exporter reads the spool it writes, structural, with a memory limit that holds the --full bound;
the systemd unit structural, capped, and the first thing the OOM killer takes."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

from checkpoint_exporter.cli import build_parser
from tests.install.test_deploy import KUBERNETES, SYSTEMD, _config, _mounts, _one, _render

pytestmark = [pytest.mark.kubectl]

UNIT = SYSTEMD / "checkpoint-exporter-restore-drill@.service"
SPOOL_ENV = "CHECKPOINT_EXPORTER_SPOOL"
# What the drill's processes need beside the --full bound: the drill itself (config, structural
# check, its metadata parse) and the interpreter of the worker, with room to spare.
MARGIN = 2 << 30
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "Ki": 1 << 10, "Mi": 1 << 20,
          "Gi": 1 << 30, "Ti": 1 << 40, "": 1}  # fmt: skip


def _bytes(quantity: str) -> int:
    """A systemd size (K, M, G: powers of 1024) or a Kubernetes memory quantity (Ki, Mi, Gi)."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|K|M|G|T|)", quantity)
    assert match, f"not a byte quantity: {quantity}"
    return int(match.group(1)) * _UNITS[match.group(2)]


def _drill_args(argv: list[str]) -> argparse.Namespace:
    try:
        return build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"the CLI rejects {argv}")


@pytest.fixture(scope="module", params=["node", "cluster"])
def shape(request: pytest.FixtureRequest) -> list[dict]:
    return _render(KUBERNETES / "node" if request.param == "node" else KUBERNETES)


def test_the_cronjob_runs_beside_the_exporter_that_reads_its_spool(shape: list[dict]) -> None:
    """Same nodes as the DaemonSet (selector, affinity, tolerations), the same spool hostPath
    at the same path, which CHECKPOINT_EXPORTER_SPOOL and the config name too."""
    node = _one(shape, "DaemonSet")["spec"]["template"]
    cron = _one(shape, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]
    for key in ("nodeSelector", "affinity", "tolerations"):
        assert cron["spec"].get(key) == node["spec"].get(key), key
    assert cron["spec"]["nodeSelector"] and cron["spec"]["tolerations"]
    spool = _config(shape)["spool"]
    node_spool, cron_spool = _mounts(node)[spool], _mounts(cron)[spool]
    assert cron_spool["hostPath"]["path"] == node_spool["hostPath"]["path"]
    assert not cron_spool["readOnly"]  # the drill writes its result there
    container = cron["spec"]["containers"][0]
    env = {variable["name"]: variable.get("value") for variable in container.get("env", [])}
    assert env[SPOOL_ENV] == spool
    # It reads the checkpoints the config names (the cluster shape's DaemonSet does not).
    roots = {root["root"] for root in _config(shape)["discover"]}
    assert roots <= {path for path, mount in _mounts(cron).items() if mount["readOnly"]}


def test_the_cronjob_runs_the_structural_drill_with_room_for_the_full_one(
    shape: list[dict],
) -> None:
    cron = _one(shape, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]
    container = cron["spec"]["containers"][0]
    args = _drill_args(container["args"])
    assert args.verb == "restore-drill" and not args.full
    resources = container["resources"]
    limit = _bytes(resources["limits"]["memory"])
    assert _bytes(resources["requests"]["memory"]) <= limit
    assert limit >= args.full_max_bytes + MARGIN  # adding --full needs no other change


def _unit_settings() -> dict[str, str]:
    settings = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            settings[key] = value
    return settings


def test_the_systemd_drill_is_structural_capped_and_killed_first() -> None:
    settings = _unit_settings()
    argv = shlex.split(settings["ExecStart"])[1:]
    args = _drill_args([arg.replace("%i", "llama70b") for arg in argv])
    assert args.verb == "restore-drill" and not args.full and args.job == "llama70b"
    high, cap = _bytes(settings["MemoryHigh"]), _bytes(settings["MemoryMax"])
    assert args.full_max_bytes + MARGIN <= cap and high < cap
    # The OOM killer takes the drill, never the training process beside it; and the drill
    # yields the CPU and the disk to it.
    assert settings["OOMScoreAdjust"] == "1000"
    assert settings["Nice"] == "19" and settings["IOSchedulingClass"] == "idle"
    assert settings["CPUWeight"] == "idle"
