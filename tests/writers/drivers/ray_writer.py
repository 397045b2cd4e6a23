"""Ray Train 2.60 (Train V2, ``TorchTrainer``, CPU, one worker) reporting checkpoints into
``ROOT``, which is the run's directory: ``RunConfig(storage_path=ROOT.parent, name=ROOT.name)``,
``CheckpointConfig(num_to_keep=2)`` (Ray's own retention).

One ``fit`` runs for the driver's whole life. Its training function runs in Ray's worker actor,
not in this process, so commands reach it through two files in SCRATCH (the second argument,
a short path: Ray's ``_temp_dir``, which holds its Unix sockets, is below it): ``commands``,
read by the worker, and ``replies``, read here. The driver prints ``ready`` once the training
function waits for its first command. Each ``save`` is a few optimizer steps, then one
``ray.train.report({"step": N}, checkpoint=Checkpoint.from_directory(local))`` with the model's
and the optimizer's ``torch.save`` files, then ``get_all_reported_checkpoints(COMMITTED)``,
which returns once Ray's controller registered the checkpoint: its checkpoint manager wrote
``checkpoint_manager_snapshot.json`` naming it and deleted what ``num_to_keep`` drops. The
``saved`` line carries the step and the persisted checkpoint's path (``ray.train.get_checkpoint``).

``hang`` replaces ``ray.train.v2._internal.execution.storage._pyarrow_fs_copy_files`` in the
worker, the copy ``StorageContext.persist_current_checkpoint`` makes into
``ROOT/checkpoint_<timestamp>``: it copies ``model.pt`` whole through the real function, then
half of ``optimizer.pt`` under its final name through the storage filesystem's
``open_output_stream`` (as pyarrow's copy writes it), and blocks. The controller never hears of
the checkpoint, so the snapshot does not name it. The test SIGKILLs the driver's whole session:
the raylet and GCS run in the driver's process group, Ray's worker processes each in a group of
their own in the same session.

Ray runs on loopback only (``_node_ip_address``), with no dashboard, no usage stats and no
token authentication (which would write ``~/.ray/auth_token``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

os.environ.update(
    RAY_TRAIN_V2_ENABLED="1",
    RAY_AUTH_MODE="disabled",
    RAY_USAGE_STATS_ENABLED="0",
    RAY_DEDUP_LOGS="0",
)

# Imported after the environment above, which Ray reads at import and its processes inherit.
import ray
from common import hang_here, say, serve
from ray.train import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

ROOT = Path(sys.argv[1])
SCRATCH = Path(sys.argv[2])
KEEP = 2


class Channel:
    """JSON lines appended to a file by one process and read in order by another."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.path.touch()

    def send(self, message: object) -> None:
        line = (json.dumps(message) + "\n").encode()
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(descriptor, line)  # one write: a reader never sees half a line
        finally:
            os.close(descriptor)

    def receive(self, alive=lambda: None) -> object:
        """The next message; ``alive()`` raises when the other side can no longer answer."""
        while True:
            with open(self.path, "rb") as stream:
                stream.seek(self.offset)
                line = stream.readline()
            if line.endswith(b"\n"):
                self.offset += len(line)
                return json.loads(line)
            alive()
            time.sleep(0.05)


def train_loop(config: dict) -> None:
    """Ray's worker: one ``ray.train.report`` with a checkpoint per ``save`` or ``hang``."""
    import tempfile

    import pyarrow.fs
    import ray.train
    import torch
    from ray.train.v2._internal.execution import storage
    from ray.train.v2.api.report_config import CheckpointConsistencyMode

    scratch = Path(config["scratch"])
    commands, replies = Channel(scratch / "commands"), Channel(scratch / "replies")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    copy_files = storage._pyarrow_fs_copy_files
    replies.send({"event": "ready"})

    def copy_half_then_hang(source, destination, source_filesystem=None,
                            destination_filesystem=None, **kwargs):  # fmt: skip
        first, last = sorted(os.listdir(source))  # model.pt, optimizer.pt
        copy_files(
            os.path.join(source, first),
            f"{destination}/{first}",
            destination_filesystem=destination_filesystem,
            **kwargs,
        )
        data = Path(source, last).read_bytes()
        stream = destination_filesystem.open_output_stream(f"{destination}/{last}")
        stream.write(data[: len(data) // 2])
        stream.flush()
        replies.send({"event": "hanging", "step": step, "path": destination})
        while True:
            time.sleep(3600)

    while True:
        verb = commands.receive()
        if verb == "quit":
            return
        for _ in range(5):
            loss = model(torch.randn(8, 256)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
        if verb == "hang":
            storage._pyarrow_fs_copy_files = copy_half_then_hang
        with tempfile.TemporaryDirectory(dir=scratch) as local:
            torch.save(model.state_dict(), os.path.join(local, "model.pt"))
            torch.save(optimizer.state_dict(), os.path.join(local, "optimizer.pt"))
            ray.train.report({"step": step}, checkpoint=Checkpoint.from_directory(local))
        # Returns once the controller registered this report: snapshot written, retention done.
        ray.train.get_all_reported_checkpoints(consistency_mode=CheckpointConsistencyMode.COMMITTED)
        persisted = ray.train.get_checkpoint()
        assert isinstance(persisted.filesystem, pyarrow.fs.LocalFileSystem)
        replies.send({"event": "saved", "step": step, "path": persisted.path})


def main() -> None:
    commands, replies = Channel(SCRATCH / "commands"), Channel(SCRATCH / "replies")
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=str(SCRATCH / "ray"),
    )
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"scratch": str(SCRATCH)},
        scaling_config=ScalingConfig(num_workers=1, use_gpu=False),
        run_config=RunConfig(
            storage_path=str(ROOT.parent),
            name=ROOT.name,
            checkpoint_config=CheckpointConfig(num_to_keep=KEEP),
        ),
    )
    failure: list[BaseException] = []

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as error:  # reported to the command loop, which is waiting
            failure.append(error)

    fitting = threading.Thread(target=fit, daemon=True)
    fitting.start()

    def alive() -> None:
        if failure:
            raise RuntimeError(f"Ray Train's fit failed: {failure[0]!r}")
        if not fitting.is_alive():
            raise RuntimeError("Ray Train's fit ended without answering")

    def save(hang: bool) -> tuple[int, str]:
        commands.send("hang" if hang else "save")
        reply = replies.receive(alive)
        assert isinstance(reply, dict)
        if reply["event"] == "hanging":
            hang_here(reply["step"], reply["path"], "ray checkpoint upload half-copied")
        return reply["step"], reply["path"]

    # Ray's start (its processes, the controller, the worker group, torch in the worker) takes
    # most of a minute on a loaded machine: the test waits for it before its first save.
    replies.receive(alive)
    say("ready")
    serve(save)
    commands.send("quit")
    fitting.join(timeout=30)


if __name__ == "__main__":
    main()
