"""A Kubernetes ConfigMap volume as the kubelet writes it, for tests of what watches one."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["ConfigMapVolume"]


class ConfigMapVolume:
    """The kubelet's AtomicWriter: the file is a symlink through ``..data`` into a
    timestamped folder; an update writes a new folder, swaps ``..data`` (a rename) and
    deletes the old folder. ``root`` is created."""

    def __init__(self, root: Path, name: str) -> None:
        self.root, self.name, self.n = root, name, 0
        root.mkdir(parents=True, exist_ok=True)

    def publish(self, text: str) -> None:
        self.n += 1
        folder = self.root / f"..2026_01_01_00_00_{self.n:02d}.{os.getpid()}"
        folder.mkdir()
        (folder / self.name).write_text(text)
        data = self.root / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        os.symlink(folder.name, self.root / "..data_tmp")
        os.rename(self.root / "..data_tmp", data)
        if not (self.root / self.name).is_symlink():
            os.symlink(f"..data/{self.name}", self.root / self.name)
        if old:
            shutil.rmtree(self.root / old)
