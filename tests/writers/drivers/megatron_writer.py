"""Megatron-LM's save: ``ROOT/iter_%07d/`` through megatron-core's ``torch_dist`` checkpointing,
then rank 0 rewrites ``ROOT/latest_checkpointed_iteration.txt`` in place.

megatron-core 0.16.1 is the real library here: a tiny ``GPTModel`` (local layer spec, CPU
initialisation), its ``sharded_state_dict``, the optimizer state sharded with megatron-core's own
helpers, ``dist_checkpointing.save`` with the ``torch_dist`` strategy wrapped in
``FullyParallelSaveStrategyWrapper`` (Megatron-LM's default ``--ckpt-fully-parallel-save``), on a
gloo process group of one rank. Megatron-LM's training package (``megatron/training``) is not in
the pip package, so ``save_checkpoint`` is reproduced step by step from NVIDIA/Megatron-LM at tag
``core_v0.16.1``, ``megatron/training/checkpointing.py``, ``save_checkpoint`` (sync save,
``ckpt_type == GLOBAL``, ``ckpt_format == "torch_dist"``):

1. ``rng_state = get_rng_state(...)``: a ``ShardedObject('rng_state', [state], (pp, tp), (pp_rank,
   tp_rank), replica_id=dp_rank)``; ``rerun_state_machine.state_dict(...)``;
2. ``checkpoint_name = get_checkpoint_name(save_dir, iteration, return_base_dir=True)``
   (``iter_{:07d}``); ``generate_state_dict(...)`` with ``args``, ``checkpoint_version`` 3.0,
   ``iteration``, ``model``, ``optimizer``, ``opt_param_scheduler``, ``rng_state`` and
   ``num_floating_point_operations_so_far``;
3. rank 0: ``ensure_directory_exists(checkpoint_name, check_parent=False)``;
4. ``dist_checkpointing.save(state_dict, checkpoint_name, save_strategy, async_sharded_save=False,
   validate_access_integrity=True, content_metadata=_clean_metadata_for_serialization(...))``:
   rank 0 ``common.pt``; the shards ``__0_{n}.distcp`` (written by forked workers of
   ``FileSystemWriterAsync``); ``.metadata`` (``.metadata.tmp`` renamed); ``metadata.json``;
5. ``torch.distributed.barrier()``;
6. rank 0, ``iter_finalize_fn``, exactly::

       with open_file(tracker_filename, 'w') as f:
           f.write("release" if release else str(iteration))

   (``open_file`` is ``megatron.core.msc_utils.open_file``: plain ``open`` without MSC);
7. ``torch.distributed.barrier()``.

Megatron-LM keeps every iteration unless ``--save-retain-interval`` is set; like users, this driver
deletes the oldest ``iter_*`` beyond three (``shutil.rmtree``) once the tracker moved on.

On CPU two CUDA calls in megatron-core's save path are stood in for: ``torch.cuda.synchronize``
(``FileSystemWriterAsync.preload_tensors``) and ``torch.cuda.current_device`` (the failure flag of
``save_state_dict_async_finalize``). A training step is AdamW on random gradients: megatron's
attention forks the CUDA RNG tracker, which a CPU build has not.

``hang`` stops inside the shard write, in the forked writer (megatron-core's
``filesystem_async._write_item``, imported there by name): the first item of each shard is on
disk, ``.metadata``, ``metadata.json`` and the tracker are not.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

# megatron-core's spawned manager re-imports this script as a module: its folder must be on
# the path for ``common``.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import hang_here, serve

warnings.filterwarnings("ignore")

# Stand-ins for the two CUDA calls on megatron-core's CPU save path (see the docstring).
torch.cuda.synchronize = lambda *args, **kwargs: None
torch.cuda.current_device = lambda: "cpu"

ROOT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
TRACKER = "latest_checkpointed_iteration.txt"
SAVE_INTERVAL = 5
KEEP = 3


def main() -> None:
    # Imported here: the writer's spawned result-queue manager re-imports this module (as
    # __mp_main__), and must not build a model or read stdin.
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing import ShardedObject
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelSaveStrategyWrapper,
    )
    from megatron.core.dist_checkpointing.utils import _clean_metadata_for_serialization
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.msc_utils import open_file
    from megatron.core.optimizer.optimizer import MegatronOptimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.rerun_state_machine import get_rerun_state_machine
    from megatron.core.transformer.transformer_config import TransformerConfig

    # One rank: an in-process store, no TCP port to collide with another test's.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)

    torch.manual_seed(0)
    config = TransformerConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
    )
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=128, max_sequence_length=32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=1e-3, min_lr=1e-5, lr_warmup_steps=10,
        lr_decay_steps=1000, lr_decay_style="cosine", start_wd=0.01, end_wd=0.01,
        wd_incr_steps=1000, wd_incr_style="constant",
    )  # fmt: skip
    args = argparse.Namespace(
        save=str(ROOT), ckpt_format="torch_dist", save_interval=SAVE_INTERVAL, lr=1e-3
    )
    checkpointing_context: dict[str, object] = {}
    state = {"iteration": 0, "flops": 0.0}
    saved: list[Path] = []
    hanging: dict[str, object] = {}

    write_item = filesystem_async._write_item

    # wraps: the writer passes ``serialization_format`` only if the signature names it.
    @functools.wraps(write_item)
    def write_item_then_maybe_hang(*args_, **kwargs):
        result = write_item(*args_, **kwargs)
        if hanging:
            stream = next(a for a in args_ if hasattr(a, "flush"))
            stream.flush()
            hang_here(hanging["step"], str(hanging["path"]), "torch_dist shard half-written")
        return result

    filesystem_async._write_item = write_item_then_maybe_hang  # forked writers inherit it

    def train(steps: int) -> None:
        for _ in range(steps):
            for parameter in model.parameters():
                parameter.grad = torch.randn_like(parameter) * 1e-2
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step(increment=1)
            state["iteration"] += 1
            state["flops"] += 1e9

    def optimizer_sharded_state_dict(model_sd: dict) -> dict:
        # What megatron-core's FP32Optimizer.sharded_state_dict does (its constructor needs CUDA).
        optim_sd = optimizer.state_dict()
        id_map = get_param_id_to_sharded_param_map(model_sd, model.parameters())
        step = MegatronOptimizer._extract_common_per_param_step(optim_sd)
        optim_state_to_sharding_state(optim_sd, id_map, exclude_keys="step")
        if step:
            optim_sd["state"]["common_step"] = step
        return optim_sd

    def save_checkpoint(iteration: int) -> Path:
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        rng_state = ShardedObject(
            "rng_state",
            [
                {
                    "random_rng_state": random.getstate(),
                    "np_rng_state": np.random.get_state(),
                    "torch_rng_state": torch.get_rng_state(),
                }
            ],
            (parallel_state.get_pipeline_model_parallel_world_size(),
             parallel_state.get_tensor_model_parallel_world_size()),
            (pp_rank, tp_rank),
            replica_id=parallel_state.get_data_parallel_rank(with_context_parallel=True),
        )  # fmt: skip
        rerun_state = get_rerun_state_machine().state_dict(
            data_iterator=None, ckpt_format="torch_dist"
        )
        checkpoint_name = os.path.join(args.save, f"iter_{iteration:07d}")
        dp_cp_group = parallel_state.get_data_parallel_group(with_context_parallel=True)
        metadata = {
            "singleton_local_shards": False,
            "chained_optim_avoid_prefix": True,
            "dp_cp_group": dp_cp_group,
        }
        state_dict: dict[str, object] = {
            "args": args,
            "checkpoint_version": 3.0,
            "iteration": iteration,
        }
        state_dict["model"] = model.sharded_state_dict(metadata=metadata)
        state_dict["optimizer"] = optimizer_sharded_state_dict(state_dict["model"])
        state_dict["opt_param_scheduler"] = scheduler.state_dict()
        if rerun_state:
            state_dict["rerun_state_machine"] = rerun_state
        state_dict["rng_state"] = rng_state
        state_dict["num_floating_point_operations_so_far"] = state["flops"]
        if dist.get_rank() == 0:
            os.makedirs(checkpoint_name, exist_ok=True)
        if "save_strategy" in checkpointing_context:
            save_strategy = checkpointing_context["save_strategy"]
        else:
            save_strategy = FullyParallelSaveStrategyWrapper(
                get_default_save_sharded_strategy("torch_dist"), dp_cp_group, False
            )
            checkpointing_context["save_strategy"] = save_strategy
        dist_checkpointing.save(
            state_dict,
            checkpoint_name,
            save_strategy,
            async_sharded_save=False,
            validate_access_integrity=True,
            preprocess_common_before_consistancy_check=None,
            content_metadata=_clean_metadata_for_serialization(metadata),
        )
        dist.barrier()
        if dist.get_rank() == 0:
            tracker_filename = os.path.join(args.save, TRACKER)
            with open_file(tracker_filename, "w") as f:
                f.write(str(iteration))
        dist.barrier()
        return Path(checkpoint_name)

    def save(hang: bool) -> tuple[int, str]:
        train(SAVE_INTERVAL)
        iteration = state["iteration"]
        if hang:
            path = ROOT / f"iter_{iteration:07d}"
            hanging.update(step=iteration, path=path)
        path = save_checkpoint(iteration)
        saved.append(path)
        while len(saved) > KEEP:
            shutil.rmtree(saved.pop(0))
        return iteration, str(path)

    serve(save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
