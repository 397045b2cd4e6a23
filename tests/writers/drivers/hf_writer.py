"""Hugging Face transformers (5.24) saving a tiny GPT-2 built from a config (no download).

``ROOT --mode trainer``: the real ``Trainer`` loop (``save_total_limit=3``, CPU): each command
trains two steps, then a callback sets ``control.should_save`` so the Trainer's own
``_save_checkpoint`` writes ``ROOT/checkpoint-N`` (model, optimizer, scheduler, rng state,
``trainer_state.json`` last) and rotates the oldest away.

``ROOT --mode root``: ``model.save_pretrained(ROOT, max_shard_size=...)`` into the same
directory every time, three safetensors shards and their index: each save rewrites the last.

``ROOT --mode dirs``: ``model.save_pretrained(ROOT/checkpoint-N, ...)``, sharded, no
``trainer_state.json``; the newest three kept as a user's own retention would.

``hang`` stops inside the shard write transformers calls (``modeling_utils.safe_save_file``),
doing what safetensors 0.8 does up to the point of a kill: a hidden ``.tmpXXXXXX`` temporary
file next to the shard, ``ftruncate``d to the shard's size, half its bytes written; the rename
onto the shard's name never happens. In ``root`` and ``dirs`` it is the second shard (the first
already renamed into place), in ``trainer`` the only one.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import string
import sys
from pathlib import Path

import torch
import transformers
from common import hang_here, say, serve
from safetensors.torch import save as safetensors_bytes
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    TrainerCallback,
    TrainingArguments,
    modeling_utils,
)

parser = argparse.ArgumentParser()
parser.add_argument("root", type=Path)
parser.add_argument("--mode", choices=("trainer", "root", "dirs"), default="trainer")
ARGS = parser.parse_args()
ROOT: Path = ARGS.root
KEEP = 3
SHARD_SIZE = "200KB"  # the model is ~480 KB of float32: three shards
STEPS_PER_SAVE = 2

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
CONFIG = GPT2Config(
    n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=32, bos_token_id=0, eos_token_id=0
)
model = GPT2LMHeadModel(CONFIG)
hanging: dict[str, object] = {}  # set by `hang`: the save to stop, and where
shards_written = 0

_safe_save_file = modeling_utils.safe_save_file


def _save_file_then_maybe_hang(tensors, filename, metadata=None):
    """safetensors.torch.save_file, or (when hanging, at the chosen shard) its first half."""
    global shards_written
    shards_written += 1
    if not hanging or shards_written < int(hanging["shard"]):
        return _safe_save_file(tensors, filename, metadata=metadata)
    data = safetensors_bytes(tensors, metadata=metadata)
    directory = os.path.dirname(os.fspath(filename))
    alphabet = string.ascii_letters + string.digits  # the tempfile crate's own name scheme
    temporary = os.path.join(directory, ".tmp" + "".join(random.choices(alphabet, k=6)))
    fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    os.ftruncate(fd, len(data))
    os.write(fd, data[: len(data) // 2])
    os.fsync(fd)
    hang_here(hanging["step"], str(hanging["path"]), f"safetensors temp of {filename} half-written")


modeling_utils.safe_save_file = _save_file_then_maybe_hang


class Tokens(torch.utils.data.Dataset):
    """Synthetic token sequences; labels are the inputs (causal LM)."""

    def __init__(self, count: int = 16, length: int = 16):
        generator = torch.Generator().manual_seed(0)
        self.rows = torch.randint(0, CONFIG.vocab_size, (count, length), generator=generator)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[index], "labels": self.rows[index]}


def read_command() -> str:
    """The next save/hang/quit from the test (EOF reads as quit)."""
    for line in sys.stdin:
        verb = line.strip()
        if verb in ("save", "hang", "quit"):
            return verb
    return "quit"


class Commands(TrainerCallback):
    """Drives the real Trainer loop from stdin: two steps per command, then a save."""

    def __init__(self) -> None:
        self.steps_left = 0

    def _next(self, state, control) -> None:
        verb = read_command()
        if verb == "quit":
            control.should_training_stop = True
            return
        self.steps_left = STEPS_PER_SAVE
        if verb == "hang":
            global shards_written
            shards_written = 0
            step = state.global_step + STEPS_PER_SAVE
            hanging.update(step=step, path=ROOT / f"checkpoint-{step}", shard=1)

    def on_train_begin(self, args, state, control, **kwargs):
        self._next(state, control)

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_training_stop:
            return
        self.steps_left -= 1
        if self.steps_left == 0:
            control.should_save = True

    def on_save(self, args, state, control, **kwargs):
        # Called by the Trainer after _save_checkpoint: trainer_state.json and rotation done.
        say("saved", step=state.global_step, path=str(ROOT / f"checkpoint-{state.global_step}"))
        self._next(state, control)


def run_trainer() -> None:
    from transformers import Trainer

    args = TrainingArguments(
        output_dir=str(ROOT),
        per_device_train_batch_size=4,
        max_steps=1_000_000,
        learning_rate=1e-3,
        save_strategy="steps",
        save_steps=1_000_000_000,  # never on its own: the callback asks for each save
        save_total_limit=KEEP,
        logging_strategy="no",
        eval_strategy="no",
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Commands()])
    trainer.train()
    say("bye")


optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
step = 0
saved: list[Path] = []


def train() -> None:
    global step
    rows = Tokens(count=4)
    for _ in range(STEPS_PER_SAVE):
        batch = rows.rows
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step += 1


def save_pretrained(hang: bool) -> tuple[int, str]:
    global shards_written
    train()
    path = ROOT if ARGS.mode == "root" else ROOT / f"checkpoint-{step}"
    if hang:
        hanging.update(step=step, path=path, shard=2)
    shards_written = 0
    model.save_pretrained(path, max_shard_size=SHARD_SIZE)
    if ARGS.mode == "dirs":
        saved.append(path)
        while len(saved) > KEEP:
            shutil.rmtree(saved.pop(0))
    return step, str(path)


if ARGS.mode == "trainer":
    run_trainer()
else:
    serve(save_pretrained)
