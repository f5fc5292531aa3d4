"""Stored runs are written whole or not at all: pytest-benchmark's file storage, saving aside and renaming.

pytest-benchmark writes a run straight into its final name; a full disk or a
killed process then leaves a truncated file among the baselines, which the
next run reads as corrupt. `AtomicFileStorage` writes the same JSON to a
temporary file beside it and renames it into place (gpuengine/bench/json_files.py),
never over a run another session stored under the same name meanwhile (it
takes the next number then), and a save that fails leaves nothing behind and
says why in `failure`, for the gate's summary and exit status (gpuengine/gate/plugin.py) instead of a
traceback that hides the session's results. `unwritable` says, before the
first test, why a store could not take the run at all.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from pytest_benchmark.storage.file import FileStorage
from pytest_benchmark.utils import safe_dumps

from gpuengine.bench.json_files import write_text


NAME_TRIES = 20   # run numbers tried before a save gives up


class AtomicFileStorage(FileStorage):
    failure: str | None = None   # why the run was not kept, when saving failed
    saved: Path | None = None    # where the run was kept, once it was
    on_failure = None            # called with `failure` as it happens (the summary is printed right after)

    def save(self, output_json, save):
        text = safe_dumps(output_json, ensure_ascii=True, indent=4)
        try:
            for _ in range(NAME_TRIES):   # another session of the clone may take the same number and name
                path = self.get(f"{self._next_num}_{save}.json")
                try:
                    write_text(path, text, new=True)
                    break
                except FileExistsError:
                    continue
            else:
                raise OSError(f"{NAME_TRIES} numbers for it were taken meanwhile")
        except OSError as exc:
            self.failure = f"{path}: {exc.strerror or exc}"
            self.logger.warning(f"Benchmark data NOT saved: {self.failure}")
            if self.on_failure is not None:
                self.on_failure(self.failure)
            return
        self.saved = Path(path)
        self.logger.info(f"Saved benchmark data in: {path}")


def atomic(bench_session, folder=None, on_failure=None) -> AtomicFileStorage:
    """The session's file storage (or one for `folder`) as an AtomicFileStorage."""
    storage = AtomicFileStorage(folder or bench_session.storage.path, logger=bench_session.logger,
                                default_machine_id=bench_session.machine_id)
    storage.on_failure = on_failure
    return storage


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
