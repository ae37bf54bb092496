"""Download a checkpoint from the Hugging Face hub once, onto this machine, with ``huggingface_hub``.

The token is whatever ``huggingface_hub`` finds itself (``HF_TOKEN``, or the file ``hf auth login``
writes): sparkctl never reads, passes, prints or records it. ``HF_ENDPOINT`` points the client at
another hub (a mirror; the tests' local one). Interrupted downloads resume: ``huggingface_hub``
keeps ``.incomplete`` files under the folder's ``.cache`` and continues them with range requests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sparkctl.errors import OperationFailed


@dataclass
class HubFiles:
    commit: str
    sizes: dict[str, int]
    sha256: dict[str, str]  # LFS files: the hub's content hash


def _why(err: Exception) -> str:
    """One line about a hub error (its class and first line: never headers, never the token)."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


def hub_files(repo: str, revision: str | None) -> HubFiles:
    """The repo's files at ``revision``: sizes, and the LFS sha256 of each large file."""
    from huggingface_hub import HfApi  # here, not at the top: heavy, and only a hub checkpoint needs it

    try:
        info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    except Exception as err:  # network, 401/404, ... become one line
        raise OperationFailed(f"hf:{repo}: {_why(err)}") from None
    sizes, sha = {}, {}
    for sibling in info.siblings or []:
        sizes[sibling.rfilename] = int(sibling.size or 0)
        lfs = getattr(sibling, "lfs", None)
        if lfs is not None and getattr(lfs, "sha256", None):
            sha[sibling.rfilename] = lfs.sha256
    return HubFiles(str(info.sha), sizes, sha)


def download(repo: str, files: HubFiles, dest: str, allow: list[str] | None = None) -> str:
    """Every file of ``repo`` at ``files.commit`` into ``dest`` (resuming what an earlier run left)."""
    from huggingface_hub import snapshot_download  # here, not at the top: as in hub_files

    os.makedirs(dest, exist_ok=True)
    try:
        return snapshot_download(repo, revision=files.commit, local_dir=dest, allow_patterns=allow)
    except Exception as err:
        raise OperationFailed(f"hf:{repo}: download failed: {_why(err)} (run again to resume)") from None
