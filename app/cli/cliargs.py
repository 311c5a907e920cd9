"""The command line's flags as settings: one map from each flag to the setting it sets, for
``kiln run`` and ``kiln bake`` (a command without a flag leaves its setting alone)."""

from __future__ import annotations

from kiln import settings as settings_mod

from app.cli.clirunner import CliError

# flag (argparse dest) -> setting; a flag's value None means "not given". The job's own
# settings under their one name (--ply is gaussians_ply's flag), and the worker's device.
FLAG_SETTINGS = {**{("ply" if name == "gaussians_ply" else name): key
                    for name, key in settings_mod.JOB_SETTINGS.items()},
                 "device": "worker.device"}


def settings_from_args(args) -> settings_mod.Settings:
    """``--config`` with ``--set KEY=VALUE`` overrides, then the flags the command has and
    was given. Raises CliError for a bad --set."""
    try:
        overrides: dict = settings_mod.parse_set(getattr(args, "set", None))
    except settings_mod.SettingsError as e:
        raise CliError(str(e)) from None
    for dest, key in FLAG_SETTINGS.items():
        value = getattr(args, dest, None)
        if dest == "ply":   # a store_true flag: only "yes" overrides the config
            value = True if value else None
        if value is not None:
            overrides[key] = value
    return settings_mod.load(getattr(args, "config", None), overrides)
