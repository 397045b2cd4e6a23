"""nvidia-resiliency-ext 0.4.1 asynchronous checkpointing (torch 2.13, CPU, two gloo ranks, FSDP2)
saving ``ROOT/step-N`` under a live exporter; the layout is plain DCP.

0.4.1 is the newest release the registry serves for this machine (0.7.0 is not available); what
follows was read in its installed code, ``nvidia_resiliency_ext/checkpointing/async_ckpt/``, and
in torch 2.13's ``torch/distributed/checkpoint/filesystem.py``, and seen with strace on the
driver's run (tests/writers/drivers/nvrx_writer.py).

What a save writes, in order:

1. ``state_dict_saver.save_state_dict_async_plan`` (each rank, in the training process): planning
   only. ``FileSystemWriterAsync.prepare_local_plan`` is DCP's ``FileSystemWriter.
   prepare_local_plan``: ``fs.mkdir(step-N)`` on every rank (``exist_ok``). The decentralized
   global plan (``prepare_decentralized_global_plan``) gives rank R the prefix ``__R_``; the
   coordinator (rank 0) gathers the local plans and builds the global ``Metadata``.
   ``FileSystemWriterAsync.prepare_write_data`` splits the rank's items into ``thread_count``
   buckets, one file each, ``__R_{n}.distcp``. Nothing is written yet.
2. ``AsyncCallsQueue.schedule_async_request`` (default ``persistent=True``):
   ``PersistentAsyncCaller`` spawns one checkpoint worker per rank at the first save
   (``async_loop``) and hands it the request; the worker runs ``preload_fn``
   (``FileSystemWriterAsync.preload_tensors``, device to host) and then
   ``FileSystemWriterAsync.write_preloaded_data_multiproc``, which forks one writer per bucket
   (``write_preloaded_data``): ``open(__R_n.distcp, "wb")`` under its final name, DCP's
   ``_write_item`` for each item (bytes first, then tensors), ``os.fsync``, the write results sent
   back through queues. ``persistent=False`` (``TemporalAsyncCaller``, "to be deprecated") forks
   the worker from the training process instead; the files are the same.
3. ``maybe_finalize_async_calls``: ``is_current_async_call_done`` all-reduces "still writing"
   over every rank, then ``AsyncRequest.execute_finalize_fns`` runs the user's finalize
   functions, here (as in the library's ``examples/checkpointing/async_writer.py``)
   ``save_state_dict_async_finalize``: ``retrieve_write_results`` (a worker's exception or a
   missing result raises), ``gather_object`` of every rank's results to the coordinator, and
   there, with no failure, ``storage_writer.finish``, DCP's ``FileSystemWriter.finish``:
   ``.metadata.tmp`` written and fsynced, an old ``.metadata`` removed, ``.metadata.tmp`` renamed
   to ``.metadata``.

What commits: ``.metadata``, renamed into place by rank 0 only after every rank's forked writers
finished and reported, exactly DCP's own commit; so the ``dcp`` layout is right and
``layout: auto`` must say ``dcp``. (With ``use_msc=True``, ``finish`` pickles straight into
``.metadata`` through multi-storage-client, no temporary name: object storage, not covered.)
Retention: none in ``async_ckpt``; the user deletes old steps (here ``shutil.rmtree``, keep 3).
A killed save leaves ``step-N/`` with ``__R_n.distcp`` shards, some partly written, and no
``.metadata`` (or a ``.metadata.tmp`` if killed inside ``finish``).

Not covered: ``checkpointing/local/`` (``LocalCheckpointManager``: per-rank
``<root>/<session>/<rank>/iter_NNNNNNN_<rank>_local.pt``, ``torch.save`` into a ``.dirty`` name
opened with ``"bx"``, renamed when complete; ``BasicTensorAwareStateDict`` asserts CUDA tensors,
so it cannot run on CPU), and ``TorchAsyncCheckpoint`` (``async_save`` of one ``torch.save``
file).
"""

from __future__ import annotations

import pytest

from tests.writers.harness import INOTIFY_EVERY_CHANGE, Scenario, watching

pytestmark = pytest.mark.writers


@pytest.mark.parametrize("watch", INOTIFY_EVERY_CHANGE)
def test_nvrx_async_save_two_ranks(tmp_path, watch: str) -> None:
    with watching(tmp_path, "nvrx", "nvrx", watch=watch) as (root, driver, watched):
        reported = Scenario(driver, watched, layout="dcp").run()
    assert [line["step"] for line in reported] == [5, 10, 15, 20, 25]
    # The killed save: shards of the forked writers on disk (how many of the four had opened
    # theirs when the kill came is a race), and never the finalize step's .metadata.
    names = sorted(p.name for p in (root / "step-25").iterdir())
    assert names and all(name.endswith(".distcp") for name in names), names
    assert sorted(p.name for p in root.iterdir()) == ["step-10", "step-15", "step-20", "step-25"]
