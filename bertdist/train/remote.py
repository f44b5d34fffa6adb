"""Checkpoints in an object store (`checkpoint.uri`): uploaded behind training, published only when whole.

Layout under the URI, the same as a local checkpoints/ directory:

    step_00000100/...              every rank's DeepSpeed files, then train_state.json (uploaded last)
    latest                         the tag of the newest checkpoint whose every file is in the store
    .uploads/step_00000100.rank-R  rank R's files are uploaded (removed once the checkpoint is published)

Saving: `bertdist.train.checkpoint.save` writes the checkpoint to OUTPUT/checkpoints as always; then each
rank hands the files it wrote to its `Uploader`, a background thread, and trains on: the upload costs the
step loop nothing beyond the local save. A rank marks its part uploaded once each of its objects is in
the store with its recorded size (the store checks each PUT's checksum on arrival). Rank 0, after its own
part, waits for every rank's mark, uploads train_state.json, and only then writes `latest`: a reader of
the store never finds `latest` naming a checkpoint with a missing file, whatever was killed when. An
upload still running when the next checkpoint is due is waited for there (said on the console), and at
the end of the run.

Resuming (`--resume auto` with a URI): the store's `latest` is the truth. Its checkpoint is downloaded
into OUTPUT/checkpoints (files already there with the recorded sha256 are kept: a restart on the same node
downloads nothing) and checked like a local one; if it fails, the next older checkpoint in the store is
tried, as locally. A fresh node, another number of ranks, or an export then reads it like any other.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from bertdist import object_store, storage
from bertdist.config import CheckpointConfig, Config
from bertdist.lease import StoreLease
from bertdist.train import integrity
from bertdist.train.checkpoint import (
    DAMAGED_FILENAME,
    LATEST_FILENAME,
    TRAIN_STATE_FILENAME,
    checkpoints_dir,
    complete_checkpoints,
    first_intact,
    marker_tag,
    read_train_state,
    refuse_foreign_checkpoints,
    resolve_resume,
    verify_files,
)
from bertdist.train.run_identity import foreign_fields
from bertdist.train.train_state import CheckpointError, TrainState, parse_train_state

UPLOADS = ".uploads"
WAIT_POLL_SECONDS = 0.5


WAIT_ALIVE_SECONDS = 5.0
"""How often a wait for an upload tells the stall watchdog the rank is alive."""


class Uploader:
    """One rank's background uploads of its checkpoint files to `uri`; rank 0 also publishes."""

    def __init__(
        self,
        uri: str,
        rank: int,
        world_size: int,
        keep_last: int,
        wait_timeout_s: float,
        lease: StoreLease | None = None,
    ):
        self.uri, self.rank, self.world_size, self.keep_last = uri, rank, world_size, keep_last
        self.wait_timeout_s = wait_timeout_s
        self.lease = lease
        """Rank 0's lease on the URI (bertdist.lease), checked before each publish."""
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def before_save(self, tag: str) -> None:
        """Rank 0, as a save of `tag` begins (the save's barrier orders this before any rank's upload of `tag`):

        - the upload marks of `tag` left by an attempt killed before it published are removed. Kept, they let
          this save's `latest` move before the other ranks had uploaded its files again (their old bytes, of the
          same sizes, passed the check);
        - a published `tag` (a step saved again after checkpoint.resume=<an older one>) stops being complete
          before any rank uploads over it, and `latest` leaves it for the newest complete one before it. Kept,
          a kill before this save published left a train state and `latest` naming files of two saves."""
        if self.rank != 0:
            return
        marks = storage.join(self.uri, UPLOADS)
        for name in storage.listdir(marks):  # [] where there is none
            if name.startswith(f"{tag}.rank-"):
                storage.remove(storage.join(marks, name))
        if not storage.exists(storage.join(self.uri, tag, TRAIN_STATE_FILENAME)):
            return
        if latest_in_store(self.uri) == tag:
            older = [t for t in complete_in_store(self.uri) if t < tag]
            marker = storage.join(self.uri, LATEST_FILENAME)
            if older:
                storage.write_text(marker, older[-1])
            else:
                storage.remove(marker)
        storage.remove(storage.join(self.uri, tag, TRAIN_STATE_FILENAME))

    def step_back(self, tag: str) -> None:
        """The store's side of checkpoint.step_back_latest (rank 0, as the run starts from the older `tag`): its
        `latest` names `tag`, or is removed when `tag` is not complete there (a relaunch then refuses to start
        rather than continue the abandoned run)."""
        newest = latest_in_store(self.uri)
        if self.rank != 0 or newest is None or newest <= tag:
            return
        marker = storage.join(self.uri, LATEST_FILENAME)
        if tag in complete_in_store(self.uri):
            storage.write_text(marker, tag)
        else:
            storage.remove(marker)

    def start(self, checkpoint_dir: Path) -> None:
        """Upload this rank's files of `checkpoint_dir` in the background. The caller has `wait()`ed for the
        previous upload before saving (the save prunes what an upload may still be reading)."""
        assert self._thread is None, "the previous upload was not waited for"
        self._thread = threading.Thread(target=self._run, args=(checkpoint_dir,), name="bertdist-upload", daemon=True)
        self._thread.start()

    def wait(self, alive: Callable[[], None] = lambda: None) -> float:
        """Wait (at most `wait_timeout_s`) for the upload in flight; re-raise its error. Returns the seconds waited.
        `alive` is called every few seconds meanwhile: the stall watchdog's progress, since an upload may take
        longer than train.stall_timeout_s (checkpoint.upload_timeout_s is 3600 s), and a rank waiting for it is
        no stalled rank."""
        t0 = time.perf_counter()
        if self._thread is not None:
            deadline = time.monotonic() + self.wait_timeout_s
            while self._thread.is_alive() and time.monotonic() < deadline:
                self._thread.join(min(WAIT_ALIVE_SECONDS, max(0.0, deadline - time.monotonic())))
                alive()
            if self._thread.is_alive():
                raise CheckpointError(
                    f"{self.uri}: the upload of a checkpoint did not finish in {self.wait_timeout_s:.0f} s"
                )
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return time.perf_counter() - t0

    def _run(self, checkpoint_dir: Path) -> None:
        try:
            files = integrity.describe_own_files(checkpoint_dir, self.rank, exclude={TRAIN_STATE_FILENAME})
            tag = checkpoint_dir.name
            target = storage.join(self.uri, tag)
            for name, facts in files.items():
                url = storage.join(target, name)
                storage.upload_file(str(checkpoint_dir / name), url)
                if storage.size(url) != facts["bytes"]:
                    raise CheckpointError(
                        f"{url}: {storage.size(url):,} bytes in the store after upload, {facts['bytes']:,} on disk"
                    )
            storage.write_json(storage.join(self.uri, UPLOADS, f"{tag}.rank-{self.rank:05d}"), sorted(files))
            if self.rank == 0:
                self._publish(checkpoint_dir, target, tag)
        except BaseException as e:  # noqa: BLE001  handed to the training thread by wait()
            self._error = e

    def _publish(self, checkpoint_dir: Path, target: str, tag: str) -> None:
        names = [f"{tag}.rank-{r:05d}" for r in range(self.world_size)]
        deadline = time.monotonic() + self.wait_timeout_s
        while missing := _missing(names, storage.listdir(storage.join(self.uri, UPLOADS))):  # one listing per poll
            if time.monotonic() > deadline:
                raise CheckpointError(
                    f"{target}: ranks {missing} did not finish uploading in {self.wait_timeout_s:.0f} s; "
                    "`latest` in the store still names the previous checkpoint"
                )
            time.sleep(WAIT_POLL_SECONDS)
        if self.lease is not None:
            self.lease.check()  # another run owns the URI now: neither `latest` nor pruning is ours to touch
        state = json.loads((checkpoint_dir / TRAIN_STATE_FILENAME).read_text())
        in_store = storage.sizes(target)
        wrong = [n for n, facts in state["files"].items() if in_store.get(n) != facts["bytes"]]
        if wrong:
            raise CheckpointError(f"{target}: {wrong[:3]} missing or of another size in the store after upload")
        storage.remove(storage.join(target, DAMAGED_FILENAME))  # this step saved again over a damaged one
        storage.upload_file(str(checkpoint_dir / TRAIN_STATE_FILENAME), storage.join(target, TRAIN_STATE_FILENAME))
        storage.write_text(storage.join(self.uri, LATEST_FILENAME), tag)
        for name in names:
            storage.remove(storage.join(self.uri, UPLOADS, name))
        self._prune(tag)

    def _prune(self, current: str) -> None:
        """Keep `current` and the `keep_last` - 1 newest published checkpoints before it in the store; damaged ones
        and those of later steps (an abandoned continuation: checkpoint.prune) are not counted, and left."""
        complete = [t for t in complete_in_store(self.uri) if t <= current]
        for tag in complete[: -self.keep_last]:
            state = storage.join(self.uri, tag, TRAIN_STATE_FILENAME)
            try:
                storage.remove(state)  # no longer complete first: a refused delete keeps it whole
                storage.remove_tree(storage.join(self.uri, tag))
            except storage.StorageError as e:  # the store refused a delete: the run goes on, saying so
                print(f"checkpoint.keep_last: {tag} is left in the store: {e}", file=sys.stderr, flush=True)


def _missing(names: list[str], present: list[str]) -> list[int]:
    """The ranks whose upload marks are not among `present`."""
    found = set(present)
    return [rank for rank, name in enumerate(names) if name not in found]


def complete_in_store(uri: str) -> list[str]:
    """Tags of the checkpoints under `uri` that have their train state and were not found damaged, oldest first."""
    tags = [n for n in storage.listdir(uri) if n.startswith("step_")]
    return [t for t in tags if _complete_and_undamaged(storage.listdir(storage.join(uri, t)))]


def _complete_and_undamaged(names: list[str]) -> bool:
    return TRAIN_STATE_FILENAME in names and DAMAGED_FILENAME not in names


def latest_in_store(uri: str) -> str | None:
    marker = storage.join(uri, LATEST_FILENAME)
    if not storage.exists(marker):
        return None
    return marker_tag(storage.read_text(marker), marker)


def fetch(uri: str, tag: str, local_root: Path, verify: str) -> Path:
    """Checkpoint `tag` of the store, downloaded into `local_root/tag` and checked; CheckpointError if it
    is incomplete or damaged. Ranks of one node download once: the others wait on a lock, then find it.

    A local copy with the store's train state is taken as it is (the run's own staging copy: no download); if
    it then fails the check, it is the local copy that is damaged (a node that crashed before its page cache
    reached the disk), not necessarily the store's: each file whose bytes differ from the record is downloaded
    again, and only a fresh copy that fails makes the checkpoint damaged. Marking the store's good copy damaged
    for a local fault sent this node back to an older checkpoint while the other nodes resumed the newer one."""
    try:
        _download(uri, tag, local_root, changed_only=True)
        verify_files(local_root / tag, verify)
    except CheckpointError:
        _download(uri, tag, local_root, changed_only=False)
        verify_files(local_root / tag, verify)
    return local_root / tag


def _download(uri: str, tag: str, local_root: Path, changed_only: bool) -> None:
    """The files of the store's checkpoint `tag` into `local_root/tag` that are not there with their recorded
    sha256; `changed_only`: nothing when the local train state is already the store's."""
    source, target = storage.join(uri, tag), local_root / tag
    local_root.mkdir(parents=True, exist_ok=True)
    with _NodeLock(local_root / ".download.lock", timeout_s=object_store.RETRY_SECONDS * 10):
        state_url = storage.join(source, TRAIN_STATE_FILENAME)
        if not storage.exists(state_url):
            raise CheckpointError(f"{source}: not a complete checkpoint (no {TRAIN_STATE_FILENAME} in the store)")
        raw = storage.read_bytes(state_url)
        recorded = json.loads(raw).get("files", {})
        target.mkdir(exist_ok=True)
        state_path = target / TRAIN_STATE_FILENAME
        if changed_only and state_path.is_file() and state_path.read_bytes() == raw:
            return
        in_store = storage.sizes(source)
        for name, facts in sorted(recorded.items()):
            if name not in in_store:
                raise CheckpointError(f"{storage.join(source, name)}: missing from the store")
            if not integrity.problems(target, {name: facts}, "sha256"):
                continue  # already here, with the recorded bytes
            storage.download_file(storage.join(source, name), str(target / name))
        with storage.atomic_write(state_path, "wb") as f:
            f.write(raw)


def resume_point(
    ck: CheckpointConfig, output_dir: str, config: dict | None = None, mark_damaged: bool = False
) -> Path | None:
    """The checkpoint a run continues from (None: a fresh start), from the store when `ck.uri` is set.

    A fresh start refuses a checkpoint directory or URI that holds another run's checkpoints. With `config`
    (this run's resolved Config.to_dict()), a checkpoint whose run differs outside what may change on resume
    (bertdist.train.run_identity.RESUMABLE_FIELDS) is refused naming the fields, before anything is downloaded.
    `mark_damaged`: this process owns the run and marks the checkpoints it finds damaged (see newest_intact)."""
    newest = latest_in_store(ck.uri) if ck.uri else None
    if ck.uri and ck.resume == "auto":
        if newest is None:
            refuse_foreign_checkpoints(output_dir)
            return None
        if config is not None:
            _refuse_another_runs_store(ck.uri, newest, config)
            local = complete_checkpoints(checkpoints_dir(output_dir))
            if local:  # the staging directory of the uploads: another run's newer checkpoints there would be kept
                # by the local prune over this run's newest, before its upload had read it
                _refuse_another_run(
                    read_train_state(local[-1]).config, config, f"train.output_dir checkpoint {local[-1]}"
                )
        return _newest_intact_in_store(ck.uri, newest, checkpoints_dir(output_dir), ck.verify, mark_damaged)
    found = resolve_resume(output_dir, ck.resume, ck.verify, mark_damaged)
    if found is None:
        refuse_foreign_checkpoints(output_dir)
        if newest is not None:
            raise CheckpointError(
                f"checkpoint.uri {ck.uri} holds another run's checkpoints (latest {newest}): continue "
                "it with --resume auto, or use another URI"
            )
    elif config is not None:
        _refuse_another_run(read_train_state(found).config, config, f"checkpoint {found}")
    return found


def preview(cfg: Config) -> str:
    """A dry run's line on `checkpoint.uri`: what the run would resume from and who holds the URI, read without
    downloading or taking anything; the refusals the run would meet (another run's checkpoints or lease) raise."""
    ck = cfg.checkpoint
    holder = StoreLease(ck.uri, cfg.train.output_dir, ck.lease_timeout_s).preview()
    newest = latest_in_store(ck.uri)
    if newest is None:
        start = "no checkpoint there, the run starts fresh"
    elif ck.resume == "auto":
        state = _refuse_another_runs_store(ck.uri, newest, cfg.to_dict())
        start = (
            f"the run resumes from {newest} (step {state.step if state else '?'}; or the newest intact one before it)"
        )
    else:
        start = f"holds checkpoints (latest {newest}); checkpoint.resume={ck.resume}"
        resume_point(ck, cfg.train.output_dir)  # refuses a fresh start over another run's checkpoints
    return f"checkpoint.uri {ck.uri}: {start}; lease: {holder}"


def _refuse_another_runs_store(uri: str, newest: str, config: dict) -> TrainState | None:
    """The train state of the store's newest checkpoint, refused when another run wrote it."""
    state_url = storage.join(uri, newest, TRAIN_STATE_FILENAME)
    if not storage.exists(state_url):
        return None
    state = parse_train_state(storage.read_bytes(state_url), state_url)
    _refuse_another_run(state.config, config, f"checkpoint.uri {uri} (latest {newest})")
    return state


def _refuse_another_run(saved: dict, config: dict, where: str) -> None:
    differ = foreign_fields(saved, config)
    if differ:
        raise CheckpointError(
            f"{where} was written by a run with other settings: "
            f"{'; '.join(differ[:4])}{' ...' if len(differ) > 4 else ''}. "
            "A resume continues that run as it was; use another checkpoint.uri / train.output_dir for a new run "
            "(to start one from these weights, export them and set checkpoint.init_from_pretrained)"
        )


def _newest_intact_in_store(uri: str, newest: str, local_root: Path, verify: str, mark_damaged: bool = False) -> Path:
    """`newest`, or the next older checkpoint in the store that is intact, downloaded. With `mark_damaged`,
    each one skipped is marked DAMAGED in the store and in its local copy (see checkpoint.newest_intact)."""
    candidates = [newest] + [t for t in reversed(complete_in_store(uri)) if t < newest]

    def mark(tag: str, reason: str) -> None:
        storage.write_text(storage.join(uri, tag, DAMAGED_FILENAME), reason + "\n")
        if (local_root / tag / TRAIN_STATE_FILENAME).is_file():
            storage.write_text(local_root / tag / DAMAGED_FILENAME, reason + "\n")

    return first_intact(
        candidates,
        lambda tag: fetch(uri, tag, local_root, verify),
        where=f"{uri}: ",
        on_damaged=mark if mark_damaged else None,
    )


class _NodeLock:
    """An exclusive lock on a local file, waited for with a deadline (ranks of a node take turns)."""

    def __init__(self, path: Path, timeout_s: float):
        self.path, self.timeout_s = path, timeout_s

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise object_store.StoreUnavailableError(  # not the checkpoint's damage: never marked so
                        f"{self.path}: another rank of this node held it for {self.timeout_s:.0f} s "
                        "while downloading a checkpoint"
                    ) from None
                time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def holds_checkpoints(url: str) -> bool:
    """A checkpoint (its train state) or a checkpoint.uri (its `latest`) is at `url`."""
    return storage.exists(storage.join(url, TRAIN_STATE_FILENAME)) or storage.exists(storage.join(url, LATEST_FILENAME))


def fetch_for_reading(url: str) -> Path:
    """A checkpoint in a store, for export or fine-tuning: `url` is a checkpoint, or a checkpoint.uri whose
    newest intact checkpoint is taken. Downloaded (and verified) under TMPDIR/bertdist-cache-UID/checkpoints. A
    checkpoint named by the user that is damaged is refused, as a local one is: not swapped for an older one."""
    if storage.exists(storage.join(url, TRAIN_STATE_FILENAME)):
        uri, tag = url.rstrip("/").rsplit("/", 1)
        return fetch(uri, tag, Path(storage.cache_path("checkpoints", uri)), "sha256")
    tag = latest_in_store(url)
    if tag is None:
        raise CheckpointError(f"{url}: neither a checkpoint nor a checkpoint.uri with a `latest` marker")
    return _newest_intact_in_store(url, tag, Path(storage.cache_path("checkpoints", url)), "sha256")
