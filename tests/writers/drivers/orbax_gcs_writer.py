"""Orbax (JAX, CPU): ``CheckpointManager`` saving a small pytree to ``gs://BUCKET/PREFIX/<step>``,
``max_to_keep=3``, asynchronous saves, against a GCS protocol server (gcp-storage-emulator in
the test).

Two clients reach the store, as read in orbax-checkpoint 0.12.8 and run here:

- tensorstore (0.1.86) writes the arrays (OCDBT under ``<step>/default/``) through its own
  ``gcs`` kvstore driver: ``TENSORSTORE_GCS_HTTP_URL`` points it at the server; with no
  credentials file and no metadata server (``GCE_METADATA_ROOT`` an address nothing answers)
  it sends its requests unauthenticated, which the emulator accepts.
- Orbax's own directory work and small files (``_CHECKPOINT_METADATA``, ``commit_success.txt``,
  the deletions of retention) go through ``etils.epath``, whose ``gs://`` backend is fsspec's
  gcsfs (``STORAGE_EMULATOR_HOST``); without gcsfs installed the first ``exists`` fails.

On ``gs://`` Orbax picks ``CommitFileTemporaryPath`` (``atomicity_defaults``): no temporary
name, no rename. A step is written under its final name: ``_CHECKPOINT_METADATA`` (commit
timestamp null), the item's data, the item's ``commit_success.txt``; then the metadata is
rewritten with ``commit_timestamp_nsecs`` and the step's ``commit_success.txt`` is the commit.

``hang`` stops at the save's first ``CommitFileTemporaryPath.finalize``, the item's: its data
is in the store, the step's metadata says not committed, and no ``commit_success.txt`` exists
for the step or the item.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from common import hang_here, serve
from etils import epath
from orbax.checkpoint._src.path import atomicity

ROOT = sys.argv[1].rstrip("/")  # gs://bucket/job
if not ROOT.startswith("gs://") or sys.argv[2:]:
    sys.exit(f"usage: {sys.argv[0]} gs://BUCKET/PREFIX")
KEEP = 3

jax.config.update("jax_platforms", "cpu")
key = jax.random.PRNGKey(0)
# Random values (about 330 KiB as float32): compression cannot shrink them to nothing.
tree = {
    "dense": {"w": jax.random.normal(key, (256, 256)), "b": jnp.zeros((256,))},
    "head": {"w": jax.random.normal(key, (256, 64))},
    "step": jnp.asarray(0),
}
manager = ocp.CheckpointManager(
    epath.Path(ROOT),
    options=ocp.CheckpointManagerOptions(max_to_keep=KEEP, enable_async_checkpointing=True),
)
# A restarted job resumes from its newest committed step, as training does: a save killed at
# step N is saved again under the same name, N, after the same number of steps.
step = manager.latest_step() or 0
hanging: dict[str, object] = {}

_finalize = atomicity.CommitFileTemporaryPath.finalize


async def _finalize_or_hang(self):  # the library's own signature
    if hanging:
        hang_here(hanging["step"], str(hanging["path"]), "orbax item written, no commit file")
    return await _finalize(self)


atomicity.CommitFileTemporaryPath.finalize = _finalize_or_hang


def train(steps: int = 5) -> None:
    global step, tree
    for _ in range(steps):
        tree = jax.tree_util.tree_map(lambda x: x * 0.99 + 0.01, tree)
        step += 1
    tree["step"] = jnp.asarray(step)


def save(hang: bool) -> tuple[int, str]:
    train()
    path = f"{ROOT}/{step}"
    if hang:
        hanging.update(step=step, path=path)
    manager.save(step, args=ocp.args.StandardSave(tree))
    manager.wait_until_finished()
    return step, path


serve(save)
