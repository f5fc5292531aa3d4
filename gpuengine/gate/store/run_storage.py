"""The one writer of stored runs: each is written whole or not at all, under the next free number.

`store_run` writes a run's JSON to a temporary file beside its name and
renames it into place (gpuengine/bench/json_files.py), never over a run
another session stored under the same name meanwhile (it takes the next
number then). pytest-benchmark writes a run straight into its final name, so a
full disk or a killed process would leave a truncated file among the
baselines: `AtomicFileStorage` is its file storage saving through
`store_run`, and a save that fails leaves nothing behind and says why in
`failure`, for the gate's summary and exit status (gpuengine/gate/plugin.py)
instead of a traceback that hides the session's results. A run spread over
several GPUs is merged and saved through `store_run` too (gpuengine/gate/spread.py).
`unwritable` says, before the first test, why a store could not take the run at all; `storage_folder` is the
folder a `--benchmark-storage` value names.
"""
from __future__ import annotations

import re
import tempfile
from pathlib import Path

from pytest_benchmark.storage.file import FileStorage
from pytest_benchmark.utils import safe_dumps

from gpuengine.bench.json_files import write_text


NAME_TRIES = 20   # run numbers tried before a save gives up
RUN_NUMBER = re.compile(r"^(\d{4})_")   # pytest-benchmark's NNNN_ counter in a run's file name


def next_run_path(folder: Path | str, tag: str) -> Path:
    """`folder/NNNN_<tag>.json`, NNNN one past the highest number there (0001 in an empty folder): the number
    pytest-benchmark gives the next run of a machine-id folder."""
    folder = Path(folder)
    numbers = [int(m.group(1)) for p in folder.glob("*.json") if (m := RUN_NUMBER.match(p.name))] \
        if folder.is_dir() else []
    return folder / f"{max(numbers, default=0) + 1:04d}_{tag}.json"


def store_run(folder: Path | str, tag: str, text: str) -> Path:
    """`text` (a run's JSON) saved as the next run of `folder`, aside and renamed; where another session took that
    number meanwhile, the next one. OSError when NAME_TRIES numbers were taken, or the folder cannot be written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for _ in range(NAME_TRIES):
        path = next_run_path(folder, tag)
        try:
            write_text(path, text, new=True)
            return path
        except FileExistsError:
            continue
        except OSError as exc:   # named by the file it was writing
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    raise OSError(f"{folder}: {NAME_TRIES} run numbers for {tag} were taken meanwhile")


class AtomicFileStorage(FileStorage):
    failure: str | None = None   # why the run was not kept, when saving failed
    saved: Path | None = None    # where the run was kept, once it was
    on_failure = None            # called with `failure` as it happens (the summary is printed right after)

    def save(self, output_json, save):
        folder = Path(self.get(save)).parent   # the machine-id folder, made where it is missing
        try:
            self.saved = store_run(folder, save, safe_dumps(output_json, ensure_ascii=True, indent=4))
        except OSError as exc:
            self.failure = f"{exc.filename or folder}: {exc.strerror or exc}"
            self.logger.warning(f"Benchmark data NOT saved: {self.failure}")
            if self.on_failure is not None:
                self.on_failure(self.failure)
            return
        self.logger.info(f"Saved benchmark data in: {self.saved}")


def atomic(bench_session, folder=None, on_failure=None) -> AtomicFileStorage:
    """The session's file storage (or one for `folder`) as an AtomicFileStorage."""
    storage = AtomicFileStorage(folder or bench_session.storage.path, logger=bench_session.logger,
                                default_machine_id=bench_session.machine_id)
    storage.on_failure = on_failure
    return storage


def storage_folder(uri: str | None) -> Path | None:
    """The folder a `--benchmark-storage` value names (`file://PATH` or a bare path), resolved; None for no value or
    another scheme."""
    if uri is None:
        return None
    if uri.startswith("file://"):
        return Path(uri[len("file://"):]).resolve()
    return None if "://" in uri else Path(uri).resolve()


def unwritable(uri: str | None) -> str | None:
    """Why runs cannot be saved into the file storage `uri` (None where they can): checked before the first test,
    so a run's results are not lost at its end."""
    if not uri or ("://" in uri and not uri.startswith("file://")):
        return None
    raw = Path(uri[len("file://"):] if uri.startswith("file://") else uri)
    for path in (raw, *raw.parents):
        if path.is_symlink():
            return (f"{path} is a symbolic link, which pytest-benchmark cannot save through: point "
                    f"--benchmark-storage at the folder it names ({path.resolve()})")
        if path.exists():
            if not path.is_dir():
                return f"{path} is not a folder"
            try:
                tempfile.TemporaryFile(dir=path).close()
            except OSError as exc:
                return f"{path} cannot be written ({exc.strerror or exc})"
            return None
    return None
