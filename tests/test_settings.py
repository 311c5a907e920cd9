import dataclasses
import json

import pytest
import yaml

from kiln import settings as S


def _leaf_keys(d, prefix=""):
    out = set()
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _leaf_keys(v, prefix + k + ".")
        else:
            out.add(prefix + k)
    return out


def test_default_yaml_matches_schema_exactly():
    data = yaml.safe_load(S.DEFAULT_CONFIG.read_text())
    assert _leaf_keys(data) == {k for k, _, _ in S.describe()}
    loaded = S.load()
    # the yaml defaults and the dataclass defaults must not drift apart
    assert loaded == S.Settings()


def test_every_yaml_key_has_a_comment():
    for line in S.DEFAULT_CONFIG.read_text().splitlines():
        if ":" in line and not line.strip().startswith("#") and not line.rstrip().endswith(":"):
            assert "#" in line, f"setting without a comment: {line!r}"


def test_override_and_types():
    s = S.load(overrides={"bake.mode": "fast", "mesh.simplify_ratio": "0.9", "bake.enabled": "false",
                          "views.count": "8"})
    assert s.bake.mode == "fast" and s.mesh.simplify_ratio == 0.9
    assert s.bake.enabled is False and s.views.count == 8


@pytest.mark.parametrize("changes,needle", [
    ({"bake.texture_size": 3}, "bake.texture_size"),
    ({"bake.texture_size": 1000}, "power of two"),
    ({"mesh.simplify_ratio": 1.5}, "allowed 0.0 to 0.999"),
    ({"views.count": 0}, "views.count"),
    ({"bake.mode": "slow"}, "fast, opt"),
    ({"bake.nonsense": 1}, "unknown setting 'bake.nonsense'"),
    ({"views.count": 2.5}, "must be an integer"),
    ({"bake.lr": float("nan")}, "finite"),
    ({"bake.enabled": "maybe"}, "true or false"),
])
def test_bad_values_name_the_key(changes, needle):
    with pytest.raises(S.SettingsError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        S.Settings().override(changes)


def test_unknown_yaml_key_rejected(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("bake:\n  colour: red\n")
    with pytest.raises(S.SettingsError, match="unknown setting 'bake.colour'"):
        S.load(p)
    p.write_text("bake: [1, 2]\n")
    with pytest.raises(S.SettingsError, match="section 'bake' must be a mapping"):
        S.load(p)
    p.write_text("bake: {mode: [\n")
    with pytest.raises(S.SettingsError, match="not valid YAML"):
        S.load(p)


def test_settings_are_frozen_and_json_roundtrip():
    s = S.Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 3
    import json
    assert S.from_dict(json.loads(s.to_json())) == s


def test_ranges_and_values_are_read_from_the_field_metadata():
    assert S.allowed_range("mesh.simplify_ratio") == (0.0, 0.999)
    assert S.allowed_range("views.count") == (1, 64)
    assert S.allowed_values("bake.texture_size") == (256, 512, 1024, 2048, 4096)
    assert S.allowed_values("bake.mode") == ("fast", "opt")
    for lo_hi_key in ("mesh.simplify_ratio", "views.count", "bake.texture_size"):
        lo, hi = S.allowed_range(lo_hi_key)
        S.Settings().override({lo_hi_key: lo})          # both ends are allowed ...
        S.Settings().override({lo_hi_key: hi})
    with pytest.raises(S.SettingsError, match="allowed 0.0 to 0.999"):   # ... and the message is the settings'
        S.Settings().override({"mesh.simplify_ratio": 0.9995})
    for key, needle in (("mesh", "is a section"), ("mesh.nope", "unknown setting"),
                        ("bake.enabled", "no numeric range")):
        with pytest.raises(S.SettingsError, match=needle):
            S.allowed_range(key)


def test_web_form_widgets_take_their_limits_from_the_settings(tmp_path):
    """One source for a setting's range: the page's sliders and choices are the settings'."""
    from app.web.server.context import AppContext
    from app.web.page.ui import build_ui

    demo = build_ui(AppContext(S.Settings(), tmp_path / "gradio"))
    widgets = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    views, simplify = widgets["kiln-views"], widgets["kiln-simplify"]
    assert (views.minimum, views.maximum) == S.allowed_range("views.count")
    assert (simplify.minimum, simplify.maximum) == S.allowed_range("mesh.simplify_ratio")
    texture = [c[1] for c in widgets["kiln-texture"].choices]
    assert texture == ["auto", *S.allowed_values("bake.texture_size")]
    assert [c[1] for c in widgets["kiln-mode"].choices] == list(S.allowed_values("bake.mode"))


def test_trusted_proxies_are_read_once_and_a_malformed_entry_is_named(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("app:\n  trusted_proxies: [127.0.0.1, '10.0.0.0/24', '::1']\n")
    assert S.load(p).app.trusted_proxies == ("127.0.0.1/32", "10.0.0.0/24", "::1/128")
    # --set gives text: comma-separated; empty means none
    assert S.load(overrides={"app.trusted_proxies": "10.0.0.7, 192.168.0.0/16"}).app.trusted_proxies == \
        ("10.0.0.7/32", "192.168.0.0/16")
    assert S.load(overrides={"app.trusted_proxies": ""}).app.trusted_proxies == ()
    assert S.Settings().app.trusted_proxies == ()
    s = S.load(overrides={"app.trusted_proxies": "10.0.0.7"})
    assert S.from_dict(json.loads(s.to_json())) == s
    for bad, needle in (("nginx.internal", "'nginx.internal' is not an IP address or CIDR network"),
                        ("10.0.0.7/8", "did you mean 10.0.0.0/8"),
                        ("10.0.0.0/33", "'10.0.0.0/33' is not an IP address"),
                        (7, "must be a list of IP addresses")):
        with pytest.raises(S.SettingsError, match=needle) as e:
            S.load(overrides={"app.trusted_proxies": bad})
        assert "app.trusted_proxies" in str(e.value)
    p.write_text("app:\n  trusted_proxies: [10.0.0.1, 5]\n")
    with pytest.raises(S.SettingsError, match="app.trusted_proxies.*5 is not an IP address"):
        S.load(p)
