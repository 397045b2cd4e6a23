"""Orbax (JAX, CPU): ``CheckpointManager`` saving a small pytree into ``ROOT/<step>``.

``max_to_keep=3`` is Orbax's own retention. The second argument, ``async`` or ``sync``, sets
``enable_async_checkpointing``; ``save`` then waits for the background commit
(``wait_until_finished``) before it reports, so the step is on disk under its final name.

``hang`` stops at the first ``AtomicRenameTemporaryPath.finalize`` of the save: the item's
tensorstore data is on disk in ``N.orbax-checkpoint-tmp/default.orbax-checkpoint-tmp/``, the
step's ``_CHECKPOINT_METADATA`` holds only its init time, and neither the item's rename, the
commit timestamp, ``commit_success.txt`` nor the step's rename has happened.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from common import hang_here, serve
from orbax.checkpoint._src.path import atomicity

ROOT = Path(sys.argv[1])
ASYNC = (sys.argv[2] if len(sys.argv) > 2 else "async") == "async"
KEEP = 3

jax.config.update("jax_platforms", "cpu")
key = jax.random.PRNGKey(0)
tree = {
    "dense": {"w": jax.random.normal(key, (256, 256)), "b": jnp.zeros((256,))},
    "head": {"w": jax.random.normal(key, (256, 64))},
    "step": jnp.asarray(0),
}
manager = ocp.CheckpointManager(
    ROOT,
    options=ocp.CheckpointManagerOptions(max_to_keep=KEEP, enable_async_checkpointing=ASYNC),
)
step = 0
hanging: dict[str, object] = {}

_finalize = atomicity.AtomicRenameTemporaryPath.finalize


async def _finalize_or_hang(self):  # the library's own signature
    if hanging:
        hang_here(hanging["step"], str(hanging["path"]), "orbax item written, not finalized")
    return await _finalize(self)


atomicity.AtomicRenameTemporaryPath.finalize = _finalize_or_hang


def train(steps: int = 5) -> None:
    global step, tree
    for _ in range(steps):
        tree = jax.tree_util.tree_map(lambda x: x * 0.99 + 0.01, tree)
        step += 1
    tree["step"] = jnp.asarray(step)


def save(hang: bool) -> tuple[int, str]:
    train()
    if hang:
        hanging.update(step=step, path=ROOT / f"{step}{atomicity.TMP_DIR_SUFFIX}")
    manager.save(step, args=ocp.args.StandardSave(tree))
    manager.wait_until_finished()
    return step, str(ROOT / str(step))


serve(save)
