"""``kiln models list`` and ``kiln models fetch``: see which checkpoints are on disk, get the rest.

The catalogue is ``kiln.models``, the downloader ``kiln.fetch``; this module only
turns them into commands, tables and exit codes (0 done, 1 a download failed, 2 a
usage problem such as an unknown name or a gated model).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from kiln import models
from kiln.checkpoints import DEFAULT_FOLDER

from app.cli.clirunner import CliError

_STATE_TEXT = {"verified": "verified", "recorded": "present (matches its first fetch)",
               "unverified": "present, unverified", "absent": "absent", "partial": "partial",
               "corrupt": "CORRUPT"}


class FetchFailed(CliError):
    exit_code = 1


def _folder(args) -> Path:
    return Path(args.dest).expanduser() if getattr(args, "dest", None) else models.models_dir()


def _size_text(m: models.ModelFile) -> str:
    return f"{m.size / 1e6:,.1f} MB" if m.size is not None else "?"


def _sam3d_commands() -> str:
    return "\n".join("  " + line for line in models.SAM3D_COMMANDS)


def _app_search_note(folder: Path) -> Optional[str]:
    """The app looks for SAM 2 checkpoints and rembg's model in ``models_dir()`` only: say
    how to use files a --dest elsewhere put somewhere else."""
    if folder.resolve() == models.models_dir().resolve():
        return None
    return (f"note: the app searches {models.models_dir()}/ (${models.MODELS_DIR_ENV}, else "
            f"{DEFAULT_FOLDER}/) for SAM 2 checkpoints and {models.REMBG_FILE}; to use them from {folder}, "
            f"set {models.MODELS_DIR_ENV}={folder} (or, for SAM 2 alone, app.sam2_checkpoint, e.g. "
            f"--set app.sam2_checkpoint={folder / 'sam2.1_hiera_tiny.pt'})")


def cmd_list(args) -> int:
    folder = _folder(args)
    rows = [("name", "size", "where", "state")]
    details, unpinned = [], []
    for m in models.catalogue():
        if m.gated:
            rows.append((m.name, "?", "your sam-3d-objects checkout", "gated: not fetched by Kiln"))
            continue
        st = models.status(m, folder)
        rows.append((m.name, _size_text(m), str(st.path.parent), _STATE_TEXT[st.state]))
        if st.detail:
            details.append(f"{m.name}: {st.detail}")
        if not m.pinned:
            unpinned.append(m.name)
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print()
    if unpinned:
        details.append(f"{', '.join(unpinned)}: {models.UNVERIFIED_NOTE}")
    for line in details:
        print(line)
    print(f"\nfolder: {folder} ({models.MODELS_DIR_ENV} or --dest changes it)")
    note = _app_search_note(folder)
    if note:
        print(note)
    print("\nSAM 3D Objects (gated on Hugging Face; Kiln never downloads it), run yourself:")
    print(_sam3d_commands())
    return 0


def _wanted(names: list[str]) -> list[models.ModelFile]:
    if names == ["all"]:
        return [m for m in models.catalogue() if not m.gated]
    picked = []
    for name in names:
        m = models.lookup(name)
        if m is None:
            known = ", ".join(["all"] + [models.short_name(x) for x in models.catalogue()])
            raise CliError(f"unknown model {name!r}; known: {known}")
        if m.gated:
            raise CliError(f"{m.name} is gated on Hugging Face, so Kiln does not download it; run:\n"
                           + _sam3d_commands())
        picked.append(m)
    return picked


def _fetch_one(m: models.ModelFile, folder: Path) -> Optional[str]:
    """Fetch one file unless a good copy is there; the error text on failure, else None."""
    st = models.status(m, folder)
    if st.usable:
        print(f"{m.name}: already present ({_STATE_TEXT[st.state]}), skipped: {st.path}")
        return None
    if st.state == "corrupt":
        print(f"{m.name}: the file on disk is wrong ({st.detail}); fetching it again", file=sys.stderr)
    from kiln.fetch import FetchError, fetch   # urllib/ssl only when something is downloaded

    print(f"{m.name}: fetching {m.url} -> {st.path}", file=sys.stderr)
    try:
        got = fetch(m, folder)
    except FetchError as e:
        return f"{m.name}: {e}"
    if got.verified:
        print(f"{m.name}: verified ({got.size:,} bytes, sha256 {got.sha256}): {got.path}")
    else:
        print(f"{m.name}: fetched, unverified (no published checksum); recorded size {got.size:,} bytes, "
              f"sha256 {got.sha256} in {models.record_path(got.path).name}: {got.path}")
    return None


def cmd_fetch(args) -> int:
    wanted = _wanted(args.names)
    folder = _folder(args)
    errors = [e for e in (_fetch_one(m, folder) for m in wanted) if e]
    note = _app_search_note(folder)
    if note and len(errors) < len(wanted):
        print(note, file=sys.stderr)
    if args.names == ["all"]:
        print("SAM 3D Objects is gated on Hugging Face and was not fetched; to get it, run:\n"
              + _sam3d_commands(), file=sys.stderr)
    if errors:
        raise FetchFailed("\n".join(errors))
    return 0


def add_parser(sub) -> None:
    """Register ``kiln models {list,fetch}`` on the top-level sub-parsers."""
    where = (f"Files go to --dest, else ${models.MODELS_DIR_ENV}, else {DEFAULT_FOLDER}/ (the folder the "
             "app, the self-test and kiln doctor search for SAM 2 checkpoints, and --mask auto for rembg's model).")
    mp = sub.add_parser("models", help="list the model checkpoints Kiln can use; download them",
                        description="Model checkpoints: which ones Kiln can use, whether they are on disk "
                                    "and intact, and a resumable, checksum-checked download. " + where)
    msub = mp.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    ls = msub.add_parser("list", help="every checkpoint, its size, folder and state",
                         description="Every checkpoint Kiln can use, where it is looked for, and whether it "
                                     "is absent, partial, present, or verified against its sha256. " + where)
    ls.add_argument("--dest", metavar="DIR", help=f"folder to look in (default: ${models.MODELS_DIR_ENV} "
                                                   f"or {DEFAULT_FOLDER}/)")
    ls.set_defaults(func=cmd_list)
    names = ", ".join(models.short_name(m) for m in models.catalogue() if not m.gated)
    fp = msub.add_parser(
        "fetch", help="download checkpoints (resumable, size and sha256 checked)",
        description="Download checkpoints to NAME.part, resume an interrupted download with an HTTP Range "
                    "request, check free disk space first and the size and sha256 at the end, then rename "
                    "the file into place. A file already present and verified is skipped. A corrupt "
                    "download is deleted (download again). Gated weights (SAM 3D Objects) are never "
                    "downloaded: the commands to get them are printed. " + where,
        epilog="Exit status: 0 every file is in place; 1 a download failed (run the same command again "
               "to resume); 2 an unknown or gated name.\nExamples:\n  kiln models fetch tiny\n"
               "  kiln models fetch all --dest /data/models",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    fp.add_argument("names", nargs="+", metavar="NAME",
                    help=f"'all', or one or more of: {names} (short forms: tiny, small, base_plus, large, rembg)")
    fp.add_argument("--dest", metavar="DIR", help=f"download folder (default: ${models.MODELS_DIR_ENV} or "
                                                   f"{DEFAULT_FOLDER}/)")
    fp.set_defaults(func=cmd_fetch)
