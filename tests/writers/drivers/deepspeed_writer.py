"""DeepSpeed (CPU accelerator, gloo, one process): ``engine.save_checkpoint(ROOT)`` with the
default tag ``global_stepN``, ZeRO stage 1, keeping the newest three tags as a user's own
retention would (``shutil.rmtree`` of the oldest; DeepSpeed deletes nothing itself).

``--no-latest`` saves with ``save_latest=False``: no ``latest`` pointer is ever written.

``hang`` stops inside the checkpoint engine's ``torch.save`` of the save's last states file (the
ZeRO optimizer states, after the model states were written whole): half of its bytes on disk,
``latest`` not rewritten.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import sys
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.update(
    MASTER_ADDR="127.0.0.1",
    MASTER_PORT=str(_free_port()),
    RANK="0",
    WORLD_SIZE="1",
    LOCAL_RANK="0",
)

import deepspeed  # noqa: E402 - the accelerator is chosen from the environment at import
import deepspeed.comm.torch  # noqa: E402 - patched below, by its module name
import torch  # noqa: E402
from common import hang_here, serve  # noqa: E402

# The CPU backend JIT-compiles a shared-memory all-reduce op (about 40 s with a C++ compiler, a
# failure without one); one gloo process never uses it, and the save path does not touch it.
sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None

ROOT = Path(sys.argv[1])
SAVE_LATEST = "--no-latest" not in sys.argv[2:]
KEEP = 3

CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
    "zero_optimization": {"stage": 1},
    "steps_per_print": 1_000_000,
}

deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128))
engine, _, _, _ = deepspeed.initialize(
    model=model, model_parameters=model.parameters(), config=CONFIG
)
saved: list[Path] = []
hanging: dict[str, object] = {}

_save = engine.checkpoint_engine.save


def _save_then_maybe_hang(state_dict, path: str) -> None:
    """The engine's own write, cut short on the last states file of a ``hang`` save."""
    if not (hanging and str(path).endswith("optim_states.pt")):
        _save(state_dict, path)
        return
    buffer = io.BytesIO()
    torch.save(state_dict, buffer, _use_new_zipfile_serialization=True)
    data = buffer.getvalue()
    with open(path, "wb") as stream:
        stream.write(data[: len(data) // 2])
        stream.flush()
        os.fsync(stream.fileno())
    hang_here(hanging["step"], str(hanging["path"]), "deepspeed optim states half-written")


engine.checkpoint_engine.save = _save_then_maybe_hang


def train(steps: int = 3) -> None:
    for _ in range(steps):
        loss = engine(torch.randn(8, 128)).pow(2).mean()
        engine.backward(loss)
        engine.step()


def save(hang: bool) -> tuple[int, str]:
    train()
    step = engine.global_steps
    path = ROOT / f"global_step{step}"
    if hang:
        hanging.update(step=step, path=path)
    engine.save_checkpoint(str(ROOT), save_latest=SAVE_LATEST)
    saved.append(path)
    while len(saved) > KEEP:
        shutil.rmtree(saved.pop(0))
    return step, str(path)


serve(save)
