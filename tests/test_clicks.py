"""Clicks that correct, without SAM 2 weights (issue 38 item 1): on a cluttered room whose
things touch (tests/clutter.py), one click on the sofa selects the sofa, a background click
removes what it lands on and nothing of the object, a click that changes nothing says why,
and a selection spread over several things is warned about on the page."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import clutter
from app.segment.clicks import ColourSpread, Spread
from app.segment.segment import GrabCutSegmenter
from app.web.photo import selection
from app.web.state.uploads import SessionState, WorkImage


@pytest.fixture(scope="module")
def seg() -> GrabCutSegmenter:
    return GrabCutSegmenter()


@pytest.fixture(scope="module", params=["beige", "blue"])
def room(request):
    """(picture, masks, the click on the sofa's seat)."""
    # drawn at 640 px: GrabCut works on a 320 px copy whatever the size, and drawing is quicker
    rgb, masks = clutter.room_scene(request.param, width=640)
    sofa = masks["sofa"]
    ys, xs = np.nonzero(sofa & (np.arange(sofa.shape[0])[:, None] > 0.61 * sofa.shape[0]))
    return rgb, masks, (float(np.median(xs)), float(np.median(ys)), 1)


def _state(rgb: np.ndarray) -> SessionState:
    img = WorkImage(name="room.jpg", work=rgb, work_alpha=None, key="k",
                    size=(rgb.shape[0], rgb.shape[1]), source=b"", has_alpha=False)
    return SessionState(image=img)


def test_clicks_select_the_sofa_and_not_what_touches_it(seg, room):
    """IoU after 1, 2 and 3 clicks (the usual protocol after the first). Today's code
    selected the sofa with the rug and the plant: IoU 0.41 / 0.33 after one click."""
    rgb, masks, first = room
    series = clutter.click_series(lambda c: seg.segment(rgb, list(c)), masks["sofa"], first, 3)
    ious = [clutter.iou(m, masks["sofa"]) for _, m in series]
    print("IoU after 1, 2, 3 clicks:", [round(v, 3) for v in ious])
    assert ious[0] >= 0.9, ious
    assert max(ious[1:]) >= 0.85, ious


def test_a_background_click_removes_the_region_it_lands_on(seg, room):
    """A box over the sofa and the table touching it selects both; a background click on
    the table takes it out (its top where the click lands, and its legs where the cut
    left them apart) and leaves the sofa. Negative control: a background click on the wall,
    which is not selected, takes nothing of the sofa."""
    rgb, masks, first = room
    ys, xs = np.nonzero(masks["sofa"] | masks["table"])
    box = (xs.min() - 10.0, ys.min() - 10.0, xs.max() + 10.0, ys.max() + 10.0)
    both = seg.segment(rgb, [], box)
    assert (both & masks["table"]).sum() >= 0.8 * masks["table"].sum()
    tx, ty = clutter.inner_point(masks["table"])
    cut = seg.segment(rgb, [(tx, ty, 0)], box)
    assert not cut[int(ty), int(tx)]
    # the part of it around the click goes at least (a background click's region reaches 6 %
    # of the image); on the beige room all of it, on the blue one the box also took the floor
    # under the table, which holds its legs to the sofa
    assert (cut & masks["table"]).sum() <= 0.8 * (both & masks["table"]).sum()
    assert clutter.iou(cut & masks["sofa"], masks["sofa"]) >= 0.95
    one = seg.segment(rgb, [first])
    wx, wy = clutter.inner_point(masks["wall"])
    wall = seg.segment(rgb, [first, (wx, wy, 0)])
    assert (one & ~wall & masks["sofa"]).sum() <= 0.02 * masks["sofa"].sum()


def test_a_background_click_on_the_object_itself_removes_its_part(seg, room):
    """A background click on the sofa's arm removes (the part near the click of) the arm and
    what is of its colour and joined to it, not the whole sofa: the seat, where the object
    click is, is not treated as background."""
    rgb, masks, first = room
    sofa = masks["sofa"]
    h, w = sofa.shape
    arm = sofa & (np.arange(w)[None, :] > 0.6 * w) & (np.arange(h)[:, None] > 0.5 * h)
    ax, ay = clutter.inner_point(arm)
    got = seg.segment(rgb, [first, (ax, ay, 0)])
    assert not got[int(ay), int(ax)] and got[int(first[1]), int(first[0])]
    assert (got & arm).sum() <= 0.6 * arm.sum()   # its region near the click, at least
    assert (got & sofa).sum() >= 0.25 * sofa.sum()


def test_a_click_that_changes_nothing_says_why(seg, room):
    rgb, masks, first = room
    st = selection.add_click(_state(rgb), first[0], first[1], False, seg)
    assert st.mask_note == "" and st.mask.any()
    again = selection.add_click(st, first[0] + 2, first[1], False, seg)
    assert "selected already" in again.mask_note
    assert "selected already" in selection.mask_summary(again)
    wx, wy = clutter.inner_point(masks["wall"])
    outside = selection.add_click(st, wx, wy, True, seg)
    assert "outside the selection already" in outside.mask_note
    tx, ty = clutter.inner_point(masks["table"])
    grew = selection.add_click(st, tx, ty, False, seg)   # it changes the mask: no note
    assert grew.mask_note == "" and (grew.mask != st.mask).sum() > 0.001 * st.mask.size


def test_unchanged_note_cases():
    before = np.zeros((100, 100), bool)
    before[20:60, 20:60] = True
    assert selection.unchanged_note(None, before, (5, 5, 1)) == ""
    assert selection.unchanged_note(before, ~before, (5, 5, 1)) == ""
    assert "changed nothing" in selection.unchanged_note(before, before, (5, 5, 1))
    assert "changed nothing" in selection.unchanged_note(before, before, (30, 30, 0))


def test_the_spread_warning_fires_on_several_things_and_not_on_one(room):
    rgb, masks, first = room
    sofa = masks["sofa"]
    spread = Spread()
    assert spread.check(sofa, [first]) == ""
    for extra in (("rug",), ("table", "lamp", "door")):
        several = sofa | np.logical_or.reduce([masks[e] for e in extra])
        assert spread.check(several, [first]), extra
    st = replace(_state(rgb), clicks=(first,), mask=sofa | masks["table"] | masks["lamp"] | masks["door"])
    assert "⚠ The selection looks like 2 things" in selection.mask_summary(st)
    assert "⚠" not in selection.mask_summary(replace(st, mask=sofa))


@pytest.mark.parametrize("kind", ["toy", "pebble", "blob"])
def test_no_spread_warning_on_one_many_coloured_object(kind):
    """A striped toy with a head, a checkered pebble: one thing, whatever its colours."""
    import composites

    photo, truth = composites.composite(kind, "gradient", seed=3)
    ys, xs = np.nonzero(truth)
    for fx in (0.3, 0.5):
        assert Spread().check(truth, [(float(np.quantile(xs, fx)), float(np.median(ys)), 1)]) == ""


def test_the_colour_warning_fires_on_a_broad_join_of_other_colours(room):
    """Sofa + rug + plant: joined broadly (the pot along the arm, the rug under the feet), so
    the thin-parts check is quiet; the rug and the plant are of other colours and lie beside
    the sofa. Figures (docs/benchmarks.md): 29-30 % of the selection beyond the sofa's colours,
    against 0 % for the sofa alone. Sofa + table + lamp (5 % at most) stays quiet: too little to
    tell from a thing's own darker parts."""
    rgb, masks, first = room
    sofa = masks["sofa"]
    cs = ColourSpread()
    joined = sofa | masks["rug"] | masks["plant"]
    assert Spread().check(joined, [first]) == ""   # what the colour rule is for
    share = cs.outside(rgb, joined, [first])
    assert share >= 1.25 * cs.beyond, share
    assert "beyond the clicked colours" in cs.check(rgb, joined, [first])
    assert cs.outside(rgb, sofa, [first]) <= 0.02
    assert cs.check(rgb, sofa | masks["table"] | masks["lamp"], [first]) == ""
    st = replace(_state(rgb), clicks=(first,), mask=joined)
    assert "⚠" in selection.mask_summary(st) and "beyond the clicked colours" in selection.mask_summary(st)
    assert "⚠" not in selection.mask_summary(replace(st, mask=sofa))
    # what the segmenter selects for one click is the sofa, and the page says nothing
    got = replace(st, mask=GrabCutSegmenter().segment(rgb, [first]))
    assert "⚠" not in selection.mask_summary(got)


@pytest.mark.parametrize("kind", ["toy", "pebble", "blob", "ellipse"])
def test_no_colour_warning_on_one_many_coloured_object(kind):
    """Negative controls: a striped toy whose stripes change hue across it, a two-colour
    checkered pebble, tests/synthetic.py's gradient checker (blob, ellipse), each clicked at
    twelve places: none of it lies beyond the clicked colours."""
    import composites

    photo, truth = composites.composite(kind, "gradient", seed=3)
    ys, xs = np.nonzero(truth)
    cs = ColourSpread()
    for fx in (0.2, 0.3, 0.5, 0.7):
        for fy in (0.2, 0.5, 0.8):
            click = (float(np.quantile(xs, fx)), float(np.quantile(ys, fy)), 1)
            if truth[int(click[1]), int(click[0])]:
                assert cs.outside(photo, truth, [click]) <= 0.05, click


def test_no_colour_warning_on_the_examples(tmp_path):
    """The built-in examples clicked in the body's middle as the page selects them: quiet."""
    from PIL import Image

    from kiln.examples import write_examples

    seg = GrabCutSegmenter()
    for path in write_examples(tmp_path):
        if path.name.endswith("_mask.png"):
            continue
        rgb = np.asarray(Image.open(path).convert("RGB"))
        h, w = rgb.shape[:2]
        for click in ((w / 2, 0.62 * h, 1), (0.4 * w, h / 2, 1)):
            mask = seg.segment(rgb, [click])
            assert ColourSpread().check(rgb, mask, [click]) == "", (path.name, click)


@pytest.mark.parametrize("picture", ["room", "toy"])
def test_a_new_object_click_runs_grabcut_once(picture, monkeypatch, request):
    """Issue 38 item 2: choosing between the narrow and the wide prior ran GrabCut twice on
    every new object click. Where the colours around the clicks tell (the sofa amid the room's
    wall and floor, the toy's stripes unlike its backdrop) it runs once, and gives the mask
    the two runs gave (bench/clicks.py: the same IoU figures)."""
    import cv2

    if picture == "room":
        rgb, masks = clutter.room_scene("blue", width=640)
        sofa = masks["sofa"]
        ys, xs = np.nonzero(sofa & (np.arange(sofa.shape[0])[:, None] > 0.61 * sofa.shape[0]))
        truth, click = sofa, (float(np.median(xs)), float(np.median(ys)), 1)
    else:
        import composites

        rgb, truth = composites.composite("toy", "gradient", seed=3)
        ys, xs = np.nonzero(truth)
        click = (float(np.median(xs)), float(np.median(ys)), 1)
    runs = []
    real = cv2.grabCut

    def counted(*args, **kwargs):
        runs.append(args[5])   # its iterations
        return real(*args, **kwargs)

    monkeypatch.setattr(cv2, "grabCut", counted)
    seg = GrabCutSegmenter()
    mask = seg.segment(rgb, [click])
    assert len(runs) == 1, runs
    assert list(seg._modes.values()) == [picture == "toy"]   # the toy: the wide prior
    # the same mask as comparing both runs (what the choice was before)
    monkeypatch.setattr(GrabCutSegmenter, "_unseen_around", lambda self, lab, near, clicks: 0.75)
    both = GrabCutSegmenter().segment(rgb, [click])
    assert len(runs) == 3
    assert (mask != both).mean() <= 0.001
    assert clutter.iou(mask, truth) >= (0.95 if picture == "room" else 0.8)


def test_a_wide_run_refused_for_a_spread_is_compared_without_running_it_again(monkeypatch):
    """Where the colours around the clicks first point to the wide prior but its mask draws a
    spread warning, the two priors are compared: the wide mask already made is that
    comparison's wide side, so GrabCut runs twice (wide, narrow), not three times (the same
    wide run again)."""
    import cv2

    import composites

    rgb, truth = composites.composite("toy", "gradient", seed=3)
    ys, xs = np.nonzero(truth)
    click = (float(np.median(xs)), float(np.median(ys)), 1)
    runs = []
    real = cv2.grabCut

    def counted(*args, **kwargs):
        runs.append(args[5])
        return real(*args, **kwargs)

    monkeypatch.setattr(cv2, "grabCut", counted)
    # clear of the backdrop's colours all round (the wide prior first), and a spread warning
    # on whatever it selects (the wide mask refused, so the priors are compared)
    monkeypatch.setattr(GrabCutSegmenter, "_unseen_around", lambda self, lab, near, clicks: 0.9)
    monkeypatch.setattr(Spread, "check", lambda self, mask, clicks: "several things")
    mask = GrabCutSegmenter().segment(rgb, [click])
    assert len(runs) == 2, runs
    assert mask.any()
