"""Plain ``torch.save`` from a training loop of one's own: ``ROOT/ckpt_step_N.pt`` each save,
keeping the newest two by ``os.remove`` of the oldest, as such a script's retention does.

The second argument says how each file is written:

- ``in-place`` (the default): ``torch.save(state, ROOT/"ckpt_step_N.pt")``: torch's zip writer
  opens the final name and the file grows there;
- ``replace``: ``torch.save(state, ROOT/"ckpt_step_N.pt.tmp")``, then ``os.replace`` onto the final
  name (the common "atomic save" idiom).

The state is a small MLP and its AdamW state, about 6 MB, so a save is many writes long.

``hang`` stops inside torch.save's own write (``torch/serialization.py`` ``_save``, which calls
``write_record`` on ``torch._C.PyTorchFileWriter`` for each record): once about half of the
tensor data records were handed to the writer, before the rest and before ``__exit__``'s
``write_end_of_file`` (the central directory and its end record). The writer class is
subclassed, not reimplemented: every record is written by torch's own C++ writer. Half a zip is
on disk, under the final name (``in-place``) or the temporary one (``replace``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from common import hang_here, serve

ROOT = Path(sys.argv[1])
MODE = sys.argv[2] if len(sys.argv) > 2 else "in-place"
if MODE not in ("in-place", "replace"):
    sys.exit(f"unknown mode {MODE!r}: in-place or replace")
KEEP = 2

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
step = 0
saved: list[Path] = []
hanging: dict[str, object] = {}


class _HangingWriter(torch._C.PyTorchFileWriter):
    """torch's zip writer, stopped half-way through the tensor records while ``hanging``."""

    def write_record(self, name, data, size, *rest):  # type: ignore[no-untyped-def]
        if hanging and name.startswith("data/") and hanging["written"] >= hanging["half"]:
            hang_here(hanging["step"], str(hanging["path"]), "torch.save zip half-written")
        result = super().write_record(name, data, size, *rest)
        if hanging and name.startswith("data/"):
            hanging["written"] += size
        return result


torch._C.PyTorchFileWriter = _HangingWriter  # what _open_zipfile_writer_file instantiates


def train(steps: int = 5) -> None:
    global step
    for _ in range(steps):
        loss = model(torch.randn(8, 256)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step += 1


def tensor_bytes(state: object) -> int:
    """The bytes of every tensor in ``state``: what torch.save writes as ``data/N`` records."""
    if isinstance(state, torch.Tensor):
        return state.untyped_storage().nbytes()
    if isinstance(state, dict):
        return sum(tensor_bytes(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(value) for value in state)
    return 0


def save(hang: bool) -> tuple[int, str]:
    train()
    final = ROOT / f"ckpt_step_{step}.pt"
    target = final.with_name(final.name + ".tmp") if MODE == "replace" else final
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    if hang:
        hanging.update(step=step, path=target, written=0, half=tensor_bytes(state) // 2)
    torch.save(state, target)
    if target != final:
        os.replace(target, final)
    saved.append(final)
    while len(saved) > KEEP:
        os.remove(saved.pop(0))
    return step, str(final)


serve(save)
