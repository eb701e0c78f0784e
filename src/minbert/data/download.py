"""Fetching the course CSV files at a pinned commit, verified against their checksums; a
download lands under a temporary name and is renamed into place only once complete and
verified."""

from __future__ import annotations

import hashlib
import http.client
import os
import secrets
import urllib.error
import urllib.request
from pathlib import Path

COURSE_REPO = "gpoesia/minbert-default-final-project"
COURSE_COMMIT = "571f43439d622b9443b984b09b1ee439b7f873df"
COURSE_URL_TEMPLATE = "https://raw.githubusercontent.com/{repo}/{commit}/data/{name}"

#: sha256 of each course file at COURSE_COMMIT. None where the checksum is not
#: known to this project (the two Quora files that are not in the shared data
#: copy): such a file can only be used unverified, and only when asked for.
COURSE_SHA256: dict[str, str | None] = {
    "ids-cfimdb-dev.csv": "3087f571b66860fe5d035b5a018d08202ad3fd3720e4821c04b2acf6c7ded559",
    "ids-cfimdb-test-student.csv": "7ae611548c9eac879e9ebb406cc9f8ae68ff12f78090e4965af5cbdfa06240f4",
    "ids-cfimdb-train.csv": "140fc513045a966109faed46a5c7a898767b96714d71bcb9c15f659129fadcea",
    "ids-sst-dev.csv": "a186ce94577635fbe10beaaddd50f16cccf6c30973221cefdf90deed2a584bfe",
    "ids-sst-test-student.csv": "bdd5a767faa0c26782117e37767ece154c30d5d04fb8727d09c71e3850a55c7b",
    "ids-sst-train.csv": "03b2b625c090f94a6afd59f114cde5282e2053aab0b101e87ed695d8a0c5b1df",
    "quora-dev.csv": "bfa3cc954a9ba300ae776a980141de65f622a3c1b97e3fd905d63245bc36d5ad",
    "quora-test-student.csv": None,
    "quora-train.csv": None,
    "sts-dev.csv": "ce3cad6f16062586ac7ba462c28b010a9be10c530fd5074165860d7b7ab4e93d",
    "sts-test-student.csv": "dee455745b72e9ca3ff74e7c056bd73e34bad5b8d5641045a2c1e7e131866f47",
    "sts-train.csv": "15d12efc2d656fffb1d61ac1f08ec4227f43925fd16f420c037cbd063699c21b",
}

_CHUNK = 1 << 16


class DownloadError(OSError):
    """A file could not be fetched completely and with the expected checksum."""


def course_url(name: str, base_url: str | None = None) -> str:
    """URL of course file `name`: the pinned commit on GitHub, or `base_url`/name
    for a mirror (the checksums still decide whether the mirror's file is right)."""
    if base_url is not None:
        return f"{base_url.rstrip('/')}/{name}"
    return COURSE_URL_TEMPLATE.format(repo=COURSE_REPO, commit=COURSE_COMMIT, name=name)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in chunks so size does not matter."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(url: str, dest: Path, sha256: str | None, *, timeout: float = 60) -> str:
    """Download ``url`` to ``dest`` (checked against ``sha256`` when given) and return its
    sha256; any failure raises ``DownloadError`` and leaves ``dest`` as it was."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Same directory as dest so the final rename cannot cross file systems; a
    # hidden, unique name so a concurrent or crashed run never collides with it.
    # Created with open() rather than tempfile so it gets the usual umask-based
    # permissions instead of 0600.
    part = dest.with_name(f".{dest.name}.{secrets.token_hex(6)}.part")
    digest = hashlib.sha256()
    received = 0
    expected_size: int | None = None
    try:
        with open(part, "xb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    expected_size = _content_length(response)
                    while chunk := response.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        received += len(chunk)
            except http.client.IncompleteRead as err:
                # http.client notices a short body itself when it knows the
                # length; count what did arrive so the message is the same.
                received += len(err.partial)
                raise DownloadError(_cut_off(dest, url, received, expected_size)) from None
            except urllib.error.HTTPError as err:
                raise DownloadError(
                    f"cannot download {dest.name} from {url}: HTTP {err.code} {err.reason}"
                ) from err
            except (urllib.error.URLError, OSError) as err:
                reason = getattr(err, "reason", None) or err
                raise DownloadError(f"cannot download {dest.name} from {url}: {reason}") from err
            if expected_size is not None and received != expected_size:
                raise DownloadError(_cut_off(dest, url, received, expected_size))
            out.flush()
            os.fsync(out.fileno())
        actual = digest.hexdigest()
        if sha256 is not None and actual != sha256.lower():
            raise DownloadError(
                f"checksum mismatch for {dest.name} downloaded from {url}: "
                f"expected sha256 {sha256.lower()}, got {actual}"
            )
        os.replace(part, dest)
    except BaseException:
        # Also on KeyboardInterrupt: a half-written .part file is never useful.
        part.unlink(missing_ok=True)
        raise
    return actual


def _content_length(response) -> int | None:
    value = response.headers.get("Content-Length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _cut_off(dest: Path, url: str, received: int, expected: int | None) -> str:
    return (
        f"download of {dest.name} from {url} was cut off: received {received} bytes "
        f"of the {expected} bytes announced"
    )
