"""nvidia-resiliency-ext 0.4.1: its asynchronous DCP save into ``ROOT/step-N``, two ranks.

Two ranks on one gloo process group (a ``FileStore`` in a private folder beside ROOT, not in
it: no TCP port to collide with another test's): this process is rank 0 and reads the commands;
it starts rank 1 (this script again) and hands each command on with ``broadcast_object_list``.
The model is sharded over both ranks with FSDP2 (``fully_shard`` on a CPU device mesh), so each
rank writes its own shards, as in nvidia-resiliency-ext's FSDP example (``examples/
checkpointing/async_writer.py``), whose recipe this follows:

1. ``init_checkpoint_metadata_cache()`` once; an ``AsyncCallsQueue()`` (persistent: one spawned
   checkpoint worker per rank);
2. per save: ``FileSystemWriterAsync(ROOT/step-N, thread_count=2)``,
   ``save_state_dict_async_plan(state, writer, None, 0, planner=DefaultSavePlanner(),
   enable_cache=True)``, ``writer.get_save_function_and_args()``, and an ``AsyncRequest(save_fn,
   save_args, [finalize_fn], preload_fn=preload_fn)`` whose ``finalize_fn`` is
   ``save_state_dict_async_finalize(*ret)`` then ``dist.barrier()``, scheduled with
   ``schedule_async_request``;
3. ``maybe_finalize_async_calls(blocking=True, no_dist=False)``: ``save`` reports once the save
   is finalized on both ranks. Then rank 0 deletes the oldest ``step-*`` beyond three
   (``shutil.rmtree``), a user's own retention: the library keeps everything.

On CPU two CUDA calls of the library's save path are stood in for, at import so that the
spawned checkpoint worker (which re-imports this script as ``__mp_main__``) has them too:
``torch.cuda.synchronize`` (``FileSystemWriterAsync.preload_tensors``) and
``torch.cuda.current_device`` (the device of the all-reduces in
``AsyncCaller.sync_all_async_calls`` and ``AsyncRequest.execute_finalize_fns``; "cpu" keeps them
real all-reduces over gloo).

``hang`` stops inside the forked writer's write: ``filesystem_async._write_item`` (DCP's, imported
there by name and looked up at each call) is wrapped so that, once rank 0 has raised the hang
flag (a file in the private folder: the persistent worker was spawned long before), each forked
writer flushes its first item to its ``__R_N.distcp`` file and blocks. ``.metadata`` is never
written: the finalize step is not reached.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

# The spawned checkpoint worker and the results-queue manager re-import this script as a
# module: its folder must be on the path for ``common``.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import hang_here, serve
from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async

warnings.filterwarnings("ignore")

# Stand-ins for the CUDA calls on the library's CPU save path (see the docstring).
torch.cuda.synchronize = lambda *args, **kwargs: None
torch.cuda.current_device = lambda: "cpu"

WORLD = 2
KEEP = 3
SAVE_INTERVAL = 5
# The private folder's hang flag, named in the environment: every process of the driver (rank 1,
# the spawned workers, their forked writers) inherits it.
HANG_FLAG = "NVRX_WRITER_HANG_FLAG"

_write_item = filesystem_async._write_item


# wraps: the writer passes ``serialization_format`` and ``transforms`` only if the signature
# names them.
@functools.wraps(_write_item)
def _write_item_then_maybe_hang(*args, **kwargs):
    result = _write_item(*args, **kwargs)
    flag = os.environ.get(HANG_FLAG)
    if flag and os.path.exists(flag):
        stream = next(a for a in args if hasattr(a, "flush"))
        stream.flush()
        step, _, path = Path(flag).read_text().partition(" ")
        hang_here(int(step), path, "nvrx forked writer: shard half-written")
    return result


filesystem_async._write_item = _write_item_then_maybe_hang


def main() -> None:
    # Imported here: the spawned processes re-import this module and must not build a model.
    from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncCallsQueue, AsyncRequest
    from nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver import (
        init_checkpoint_metadata_cache,
        save_state_dict_async_finalize,
        save_state_dict_async_plan,
    )
    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    root = Path(sys.argv[1])
    rank = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    if rank == 0:
        # Beside the watched root, never in it: the test's own folder, removed with it even
        # when the driver is SIGKILLed.
        private = tempfile.mkdtemp(prefix="nvrx-writer-", dir=root.parent)
        os.environ[HANG_FLAG] = os.path.join(private, "hang")
        # Rank 1 stays in this process group (the test SIGKILLs the group); its stdout goes to
        # stderr so that only rank 0 speaks the driver protocol, its writers' "hanging" aside.
        peer = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(root), "1", private],
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr,
        )
    else:
        private = sys.argv[3]
    dist.init_process_group(
        "gloo", store=dist.FileStore(os.path.join(private, "store"), WORLD), rank=rank,
        world_size=WORLD,
    )  # fmt: skip
    mesh = init_device_mesh("cpu", (WORLD,))

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)
    )
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + rank)  # each rank its own batches

    init_checkpoint_metadata_cache()
    calls = AsyncCallsQueue()
    step = 0
    saved: list[Path] = []

    def command(verb: str | None) -> str:
        """Rank 0's verb, on both ranks."""
        box = [verb]
        dist.broadcast_object_list(box, src=0)
        return str(box[0])

    def save(hang: bool) -> tuple[int, str]:
        nonlocal step
        for _ in range(SAVE_INTERVAL):
            model(torch.randn(8, 256)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
        path = root / f"step-{step}"
        model_state, optim_state = get_state_dict(model, optimizer)
        writer = filesystem_async.FileSystemWriterAsync(str(path), thread_count=2)
        planned = save_state_dict_async_plan(
            {"model": model_state, "optim": optim_state},
            writer,
            None,
            0,
            planner=DefaultSavePlanner(),
            enable_cache=True,
        )
        save_fn, preload_fn, save_args = writer.get_save_function_and_args()

        def finalize() -> None:
            save_state_dict_async_finalize(*planned)
            dist.barrier()

        calls.schedule_async_request(
            AsyncRequest(save_fn, save_args, [finalize], preload_fn=preload_fn)
        )
        calls.maybe_finalize_async_calls(blocking=True, no_dist=False)
        if rank == 0:
            saved.append(path)
            while len(saved) > KEEP:
                shutil.rmtree(saved.pop(0))
        return step, str(path)

    if rank == 0:

        def save_on_both(hang: bool) -> tuple[int, str]:
            if hang:
                # Raised before rank 1 hears of the save: both ranks' writers stop.
                # Renamed into place: a writer never reads a half-written flag.
                flag = Path(os.environ[HANG_FLAG])
                upcoming = step + SAVE_INTERVAL
                flag.with_suffix(".tmp").write_text(f"{upcoming} {root / f'step-{upcoming}'}")
                flag.with_suffix(".tmp").replace(flag)
            command("hang" if hang else "save")
            return save(hang)

        serve(save_on_both)
        command("quit")
    else:
        while (verb := command(None)) != "quit":
            save(verb == "hang")
    calls.close()
    dist.destroy_process_group()
    if rank == 0:
        peer.wait(timeout=60)
        shutil.rmtree(private, ignore_errors=True)


if __name__ == "__main__":
    main()
