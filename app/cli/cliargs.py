"""The command line's flags as settings: one map from each flag to the setting it sets, for
``kiln run`` and ``kiln bake`` (a command without a flag leaves its setting alone)."""

from __future__ import annotations

import re

from kiln import settings as settings_mod

from app.cli.clirunner import CliError

# a job setting whose flag is not its name: --ply is gaussians_ply's, --format formats'
_FLAG_NAME = {"gaussians_ply": "ply", "formats": "format"}
# flag (argparse dest) -> setting; a flag's value None means "not given". The job's own
# settings under their one name, and the worker's device.
FLAG_SETTINGS = {**{_FLAG_NAME.get(name, name): key for name, key in settings_mod.JOB_SETTINGS.items()},
                 "device": "worker.device", "mirror_fill": "bake.mirror_fill"}
_SETTING_RE = re.compile(r"setting '([\w.]+)'(?: = |: )?")


def add_format_flags(group) -> None:
    """``--format``, ``--texture-format`` and ``--units`` on ``group`` (a parser or an argument
    group); their values are checked by the settings (``kiln.settings``), with the flag named."""
    dflt = settings_mod.Settings().export
    group.add_argument("--format", metavar="LIST",
                       help="files to write, comma-separated from %s: obj is a zip of .obj + .mtl + "
                            "texture, stl a z-up STL for printing (see --units), ply a mesh with a colour "
                            "per vertex (<name>.mesh.ply; --ply stays the Gaussians). The GLB is always "
                            "written; the others go beside it with the same name (default %s)"
                       % (",".join(settings_mod.allowed_values("export.formats")), ",".join(dflt.formats)))
    group.add_argument("--texture-format", choices=list(settings_mod.allowed_values("export.texture_format")),
                       help="how the texture is stored in the GLB and the OBJ zip: png (lossless), jpeg or "
                            "webp (about 2-3 times smaller on a photo texture; a WebP GLB needs a viewer with EXT_texture_webp) "
                            "(default %s)" % dflt.texture_format)
    group.add_argument("--units", choices=list(settings_mod.allowed_values("export.units")),
                       help="what one unit of the STL is: m, or mm (coordinates x 1000); Kiln's model "
                            "coordinates are taken as metres, and the report gives the scale (default %s)"
                       % dflt.units)


def settings_from_args(args) -> settings_mod.Settings:
    """``--config`` with ``--set KEY=VALUE`` overrides, then the flags the command has and
    was given. Raises CliError for a bad --set, and names the flag of a bad flag's value."""
    try:
        overrides: dict = settings_mod.parse_set(getattr(args, "set", None))
    except settings_mod.SettingsError as e:
        raise CliError(str(e)) from None
    given = {}
    for dest, key in FLAG_SETTINGS.items():
        value = getattr(args, dest, None)
        if dest == "ply":   # a store_true flag: only "yes" overrides the config
            value = True if value else None
        if value is not None:
            overrides[key] = value
            given[key] = "--" + dest.replace("_", "-")
    overrides.update(settings_mod.ray_overrides(getattr(args, "ray", None)))
    try:
        return settings_mod.load(getattr(args, "config", None), overrides)
    except settings_mod.SettingsError as e:
        m = _SETTING_RE.match(str(e))
        if m is None or m.group(1) not in given:
            raise
        raise CliError(f"{given[m.group(1)]}: {str(e)[m.end():]} (setting '{m.group(1)}')") from None
