"""A real multi-process PyTorch DCP job for the tests: gloo ranks saving every few seconds.

Each rank owns distinct tensors, so each writes its own ``__{rank}_0.distcp`` shard. Rank 0 prints
one JSON line per finished save: {"step", "path", "mode", "returned"}.
``--hang-in-finish STEP`` makes rank 0 stop inside DCP's commit for that step (shards written,
``.metadata`` not yet), printing {"event": "in-finish"} first, so a test can SIGKILL it there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings


def _rank_main(rank: int, args: argparse.Namespace, store: str) -> None:
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    class HangingWriter(FileSystemWriter):
        def finish(self, metadata, results):  # type: ignore[no-untyped-def]
            print(json.dumps({"event": "in-finish"}), flush=True)
            time.sleep(600)
            return super().finish(metadata, results)

    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=args.world_size
    )
    if args.instrument:
        _instrumented(rank, args, torch, dist)
        return
    for index in range(args.steps):
        step = args.first_step + index * args.step_every
        mode = "async" if args.mode == "async" or (args.mode == "both" and index % 2) else "sync"
        state = {f"rank{rank}": {"w": torch.full((args.elements,), float(step))}, "step": step}
        path = os.path.join(args.root, f"step-{step}")
        if step == args.hang_in_finish and rank == 0:
            dcp.save(state, storage_writer=HangingWriter(path))
        elif step == args.hang_in_finish:
            dcp.save(state, checkpoint_id=path)
        elif mode == "async":
            dcp.async_save(state, checkpoint_id=path).result()
        else:
            dcp.save(state, checkpoint_id=path)
        if rank == 0:
            line = {"step": step, "path": path, "mode": mode, "returned": time.time()}
            print(json.dumps(line), flush=True)
        dist.barrier()
        if index + 1 < args.steps:
            time.sleep(args.interval)
    dist.destroy_process_group()


def _instrumented(rank: int, args: argparse.Namespace, torch, dist) -> None:  # type: ignore[no-untyped-def]
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    from checkpoint_exporter import instrument

    modes = ("save", "async", "staged")
    for index in range(args.steps):
        step = args.first_step + index * args.step_every
        mode = modes[index % len(modes)]
        state = {f"rank{rank}": {"w": torch.full((args.elements,), float(step))}, "step": step}
        path = os.path.join(args.root, f"step-{step}")
        kwargs = {"checkpoint_id": path, "training_job": args.instrument, "step": step}
        if mode == "save":
            instrument.save(state, **kwargs)
        elif mode == "async":
            instrument.async_save(state, **kwargs).result()
        else:
            options = StagingOptions(False, False, True, False)  # CPU: no pinned/shared memory
            stager = DefaultStager(options)
            response = instrument.async_save(state, async_stager=stager, **kwargs)
            assert hasattr(response, "staging_completion"), type(response)
            response.staging_completion.result()
            response.upload_completion.result()
            stager.close()
        if rank == 0:
            line = {"step": step, "path": path, "mode": mode, "returned": time.time()}
            print(json.dumps(line), flush=True)
        dist.barrier()
        if index + 1 < args.steps:
            time.sleep(args.interval)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--first-step", type=int, default=100)
    parser.add_argument("--step-every", type=int, default=100)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--elements", type=int, default=64 * 1024)
    parser.add_argument("--mode", choices=("sync", "async", "both"), default="both")
    parser.add_argument(
        "--instrument",
        metavar="JOB",
        help="save through checkpoint_exporter.instrument as training job JOB, cycling through "
        "save, async_save and async_save with async staging (spool from the environment)",
    )
    parser.add_argument("--hang-in-finish", type=int, default=-1)
    args = parser.parse_args()
    import torch.multiprocessing as mp

    store = tempfile.mktemp(prefix="dcp-writer-store-")
    try:
        mp.start_processes(
            _rank_main, args=(args, store), nprocs=args.world_size, start_method="fork"
        )
    finally:
        if os.path.exists(store):
            os.unlink(store)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
