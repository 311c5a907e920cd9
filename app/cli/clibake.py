"""``kiln bake``: texture a mesh another tool made (SAM 3D Objects, SAM 3D Body, TRELLIS,
3DGS, Kiln itself) from its splat, its photo and its own colours, in the same isolated
worker as ``kiln run``."""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from kiln import settings as settings_mod
from kiln.bakerequest import CAMERA_FRAMES, SOURCES
from kiln.formats import human_bytes

from app.cli.cliargs import add_format_flags, settings_from_args
from app.cli.clirunner import CliError, InProcessRunner, WorkerRunner, write_report
from app.cli.cliview import ProgressLine, timing_table, written_files

DESCRIPTION = """\
Bake a textured GLB from a mesh you already have. Each texel takes its colour from, in order:
the photo (where its camera sees the surface inside the mask), the splat (rendered from views
around the mesh), the mesh's own vertex colours or texture, then a fill from neighbouring
texels. The GLB keeps the mesh file's frame, so it lines up with the file it came from.

Every file is read and checked before the worker starts (exit 2 with the reason). The bake
runs in a crash-isolated worker like `kiln run` (progress per stage, Ctrl-C cancels)."""

EXAMPLES = """\
examples, by the tool that made the files:
  SAM 3D Objects (scene GLB in the camera frame, canonical splat, photo + mask, focal unknown):
    kiln bake --mesh scene.glb --splat splat.ply --source sam3d --image photo.png --mask mask.png -o out.glb
    (no camera given: it is fitted to the mask, and the output says how well it fits)
  SAM 3D Body (mesh in the OpenGL camera frame, its focal length known):
    kiln bake --mesh body.ply --image photo.png --mask person.png --focal 1623.09 -o body.glb
  TRELLIS (GLB and save_ply's splat, no photo):
    kiln bake --mesh sample.glb --splat sample.ply --source trellis -o sample-baked.glb
  3DGS (a mesh extracted from an INRIA splat, in the splat's frame):
    kiln bake --mesh mesh.ply --splat point_cloud.ply --source inria --new-uvs -o out.glb
  Kiln (a `kiln run --ply` pair, the photo's camera from its --report):
    kiln bake --mesh a.glb --splat a.ply --source kiln --image a.png --camera a-report.json -o b.glb

Exit status: 0 the GLB was written; 1 the job failed (a stage error, a worker crash or hang, no
space left); 2 a usage or input problem, found before any worker starts; 130 interrupted by
Ctrl-C (the job is cancelled and its worker stopped)."""


class PhotoOption(argparse.Action):
    """Keeps the photo options in the order given (``args.photo_options``: (flag, value)
    pairs), so that ``photo_groups`` can give each --mask and camera option to the --image
    before it: argparse alone keeps each flag's values apart and loses their order."""

    def __call__(self, parser, namespace, values, option_string=None):
        got = list(getattr(namespace, "photo_options", None) or [])
        got.append((option_string, True if self.nargs == 0 else values))
        namespace.photo_options = got
        _keep_order(namespace, option_string, True if self.nargs == 0 else values)


class ObjectOption(argparse.Action):
    """--mesh and --splat, kept in order with the photo options (``args.bake_options``), so
    that ``scene_groups`` can give each --splat and --mask to the --mesh before it."""

    def __call__(self, parser, namespace, values, option_string=None):
        _keep_order(namespace, option_string, values)


def _keep_order(namespace, flag: str, value) -> None:
    got = list(getattr(namespace, "bake_options", None) or [])
    got.append((flag, value))
    namespace.bake_options = got


@dataclass(frozen=True)
class PhotoArgs:
    """One --image and the options after it, before the next --image."""

    image: Optional[str] = None
    mask: Optional[str] = None
    camera: Optional[str] = None
    focal: Optional[float] = None
    principal: Optional[tuple[float, float]] = None
    camera_frame: str = "opengl"
    fit_camera: bool = False


# the flag -> PhotoArgs field each photo option sets
_PHOTO_FIELDS = {"--mask": "mask", "--camera": "camera", "--focal": "focal", "--principal": "principal",
                 "--camera-frame": "camera_frame", "--fit-camera": "fit_camera"}


def photo_groups(options: list) -> list[PhotoArgs]:
    """The photos of ``kiln bake``, each --image with the options that follow it up to the
    next --image. ``options``: (flag, value) pairs in the order given. CliError for an option
    before any --image, or given twice for one photo."""
    groups: list[dict] = []
    for flag, value in options:
        if flag == "--image":
            groups.append({"image": value, "flags": set()})
            continue
        if not groups:
            raise CliError(f"{flag} belongs to the --image before it, and no --image comes before it: "
                           f"give the photo too (--image P {flag} ...)")
        group = groups[-1]
        if flag in group["flags"]:
            raise CliError(f"{flag} is given twice for --image {group['image']}: each photo takes one "
                           "(a --mask or camera option belongs to the --image before it)")
        group["flags"].add(flag)
        group[_PHOTO_FIELDS[flag]] = value
    return [PhotoArgs(**{k: v for k, v in g.items() if k != "flags"}) for g in groups]


@dataclass(frozen=True)
class ObjectArgs:
    """One object of ``kiln bake --scene``: a --mesh and the --splat and --mask after it."""

    mesh: str
    splat: Optional[str] = None
    mask: Optional[str] = None


def scene_groups(options: list) -> tuple[list[ObjectArgs], PhotoArgs]:
    """``kiln bake --scene``'s objects (each --mesh with the --splat and --mask after it, up to
    the next --mesh) and its one photo with its camera options. CliError for a --splat or
    --mask before any --mesh, one given twice for a mesh, or a second --image."""
    objects: list[dict] = []
    photo: dict = {}
    for flag, value in options:
        if flag == "--mesh":
            objects.append({"mesh": value})
        elif flag in ("--splat", "--mask"):
            if not objects:
                raise CliError(f"with --scene, {flag} belongs to the --mesh before it, and none comes before it")
            key = flag[2:]
            if key in objects[-1]:
                raise CliError(f"{flag} is given twice for --mesh {objects[-1]['mesh']}: each object takes one")
            objects[-1][key] = value
        else:
            key = "image" if flag == "--image" else _PHOTO_FIELDS[flag]
            if key in photo:
                raise CliError(f"{flag} is given twice: a scene has one photo and one camera"
                               + (" (its objects share them)" if key == "image" else ""))
            photo[key] = value
    return [ObjectArgs(**o) for o in objects], PhotoArgs(**photo)


def _principal(text: str) -> tuple[float, float]:
    try:
        cx, cy = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CX,CY in pixels (e.g. 640,360), got {text!r}") from None
    return cx, cy


def add_parser(sub) -> None:
    """``kiln bake``'s flags, on the ``kiln`` command's subparsers."""
    b = sub.add_parser("bake", help="texture a mesh you already have (SAM 3D, TRELLIS, 3DGS, Kiln) "
                                    "from its splat, photo or own colours",
                       description=DESCRIPTION, epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    files = b.add_argument_group("files")
    files.add_argument("--mesh", required=True, metavar="M", action=ObjectOption,
                       help="the mesh: GLB/glTF, OBJ (+MTL), PLY or STL, with or without UVs, "
                            "vertex colours, a texture; with --scene, repeat it for each object")
    files.add_argument("--splat", metavar="S", action=ObjectOption,
                       help="its Gaussian splat: a 3DGS PLY (INRIA layout, SH degree 0-3), as 3DGS, SAM 3D, "
                            "TRELLIS and Kiln write; with --scene, the splat of the --mesh before it")
    files.add_argument("--scene", action="store_true",
                       help="several objects of one photo, textured together into one GLB with a node per "
                            "object (named after its mesh file) in the photo's camera frame: --scene --mesh A "
                            "[--splat SA] --mask MA --mesh B [--splat SB] --mask MB ... --image P [--camera C | "
                            "--focal F]. Each --splat and --mask belongs to the --mesh before it; one photo, one "
                            "camera (none given: fitted to the first object). An object whose pose does not fit "
                            "the camera is fitted under it with the intrinsics held; a texel another object hides "
                            "takes none of its colours. --format's files come one per object (OUT.<object>.obj.zip)")
    files.add_argument("--image", metavar="P", action=PhotoOption,
                       help="a photo of the object, projected onto the surface its camera sees; repeat "
                            "for several photos (--image A [--mask MA] [--camera CA] --image B ...): each "
                            "texel takes the photo that sees it best, their colours levelled where one "
                            "hands over to the next. --mask and the camera options belong to the --image "
                            "before them")
    files.add_argument("--mask", metavar="K", action=PhotoOption,
                       help="the object's mask in the photo before it (white = object; default: the "
                            "photo's transparency); a texel outside it never takes the photo's colour")
    files.add_argument("-o", "--output", required=True, metavar="OUT.glb",
                       help="the GLB to write; --format's other files go beside it (OUT.obj.zip, OUT.stl, "
                            "OUT.mesh.ply)")
    files.add_argument("--report", metavar="R.json",
                       help="write timings and stats (camera used, frame, surface distance, "
                            "silhouette, texel sources, peak memory) to this JSON file")
    cam = b.add_argument_group("each photo's camera (after its --image; without one, it is fitted to the mask)")
    cam.add_argument("--camera", metavar="C.json", action=PhotoOption,
                     help="a camera JSON: the source_camera that `kiln run --report` writes (K in "
                          "pixels, OpenCV world-to-camera matrix in the mesh's frame, width, height), "
                          "or such a report")
    cam.add_argument("--focal", type=float, metavar="F", action=PhotoOption,
                     help="focal length in pixels of the photo, for a mesh placed in the camera's frame")
    cam.add_argument("--principal", type=_principal, metavar="CX,CY", action=PhotoOption,
                     help="principal point in pixels (default: the image centre)")
    cam.add_argument("--camera-frame", choices=CAMERA_FRAMES, action=PhotoOption,
                     help="with --focal: the mesh's camera frame, opengl (looking down -z, y up: "
                          "SAM 3D) or opencv (looking down +z, y down) (default opengl)")
    cam.add_argument("--fit-camera", nargs=0, action=PhotoOption,
                     help="fit the camera to the mask (the default when a photo comes without a camera)")
    how = b.add_argument_group("how")
    how.add_argument("--source", choices=SOURCES, default="auto",
                     help="which tool wrote the splat, which fixes its frame relative to the mesh; "
                          "auto tries each and keeps the one that puts the splat on the mesh "
                          "surface (default auto)")
    uvs = how.add_mutually_exclusive_group()
    uvs.add_argument("--keep-uvs", dest="uvs", action="store_const", const="keep",
                     help="bake into the mesh's own UVs, unsimplified (the default when it has usable UVs)")
    uvs.add_argument("--new-uvs", dest="uvs", action="store_const", const="new",
                     help="simplify and unwrap as `kiln run` does")
    rng, dflt = settings_mod.allowed_range, settings_mod.Settings()
    how.add_argument("--simplify-ratio", type=float, help="with new UVs: fraction of faces removed, "
                     "%g-%g (default: none, beyond what the unwrap needs to take the mesh: at most "
                     "%d faces)" % (*rng("mesh.simplify_ratio"), dflt.mesh.max_faces_for_uv))
    how.add_argument("--faces", type=int, metavar="N",
                     help="with new UVs: simplify to N faces (within 2 %%) instead of by --simplify-ratio; "
                          "refused above the mesh's own count")
    how.add_argument("--texture-size", help="texture size in texels, power of two %d-%d (default 1024)"
                     % rng("bake.texture_size"))
    how.add_argument("--views", type=int, help="splat views to bake from, %d-%d (default %d)"
                     % (*rng("views.count"), dflt.views.count))
    how.add_argument("--bake-mode", choices=list(settings_mod.allowed_values("bake.mode")),
                     help="texture bake mode (default %s)" % dflt.bake.mode)
    how.add_argument("--seed", type=int, help="random seed (default %d)" % dflt.seed)
    how.add_argument("--mirror-fill", choices=list(settings_mod.allowed_values("bake.mirror_fill")),
                     help="auto: texels the photo does not see take the colour of their mirror image "
                          "where the photo sees it, when the mesh is mirror-symmetric and the photo "
                          "confirms its picture is too (the report gives the plane, its score and the "
                          "share filled); off: never (default %s)" % dflt.bake.mirror_fill)
    how.add_argument("--device", choices=["auto", "cpu", "cuda"], help="worker device (default auto)")
    how.add_argument("--config", help="settings YAML (default: configs/default.yaml)")
    how.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override any setting, e.g. --set bake.photo_min_inside=0.8 (see `kiln settings`)")
    add_format_flags(b.add_argument_group("files to write (beside the GLB)"))
    how.add_argument("--in-process", action="store_true",
                     help="run the stages in this process instead of a crash-isolated worker (debugging)")
    b.set_defaults(func=cmd_bake, uvs="auto", photo_options=None, bake_options=None, scene=False)


def cmd_bake(args) -> int:
    from worker.jobs.bakeinputs import BakeFiles, PhotoFiles, bake_settings

    asked = args.simplify_ratio is not None or bool(args.faces)   # a ratio or an exact count
    settings = bake_settings(settings_from_args(args), simplify_asked=asked)
    out = Path(args.output)
    if out.suffix.lower() != ".glb":
        raise CliError(f"-o {out} must end in .glb")
    if args.scene:
        return _bake(args, settings, asked, out, *_scene_files(args))
    meshes = [v for f, v in args.bake_options or () if f == "--mesh"]
    splats = [v for f, v in args.bake_options or () if f == "--splat"]
    if len(meshes) > 1 or len(splats) > 1:
        flag, times = ("--mesh", len(meshes)) if len(meshes) > 1 else ("--splat", len(splats))
        raise CliError(f"{flag} is given {times} times: several objects of one photo are a scene; "
                       "add --scene (then each --splat and --mask belongs to the --mesh before it)")
    args.mesh, args.splat = meshes[0], (splats[0] if splats else None)
    photos = photo_groups(args.photo_options or [])
    first = photos[0] if photos else PhotoArgs()
    files = BakeFiles(mesh=Path(args.mesh), splat=_path(args.splat), image=_path(first.image),
                      mask=_path(first.mask), camera=_path(first.camera), focal=first.focal,
                      principal=first.principal, camera_frame=first.camera_frame,
                      fit_camera=first.fit_camera, source=args.source, uvs=args.uvs,
                      more_photos=tuple(PhotoFiles(image=Path(p.image or ""), mask=_path(p.mask), camera=_path(p.camera),
                                                   focal=p.focal, principal=p.principal,
                                                   camera_frame=p.camera_frame, fit_camera=p.fit_camera)
                                        for p in photos[1:]))
    return _bake(args, settings, asked, out, files, ())


def _scene_files(args) -> tuple:
    """(the scene's photo and first object as ``BakeFiles``, the other objects)."""
    from worker.jobs.bakeinputs import BakeFiles
    from worker.jobs.sceneinputs import SceneObjectFiles

    objects, photo = scene_groups(args.bake_options or [])
    first = objects[0]
    files = BakeFiles(mesh=Path(first.mesh), splat=_path(first.splat), image=_path(photo.image),
                      mask=_path(first.mask), camera=_path(photo.camera), focal=photo.focal,
                      principal=photo.principal, camera_frame=photo.camera_frame, fit_camera=photo.fit_camera,
                      source=args.source, uvs=args.uvs)
    return files, tuple(SceneObjectFiles(mesh=Path(o.mesh), mask=_path(o.mask), splat=_path(o.splat))
                        for o in objects[1:])


def _bake(args, settings, asked: bool, out: Path, files, objects: tuple) -> int:
    """Check ``files`` (and a scene's further ``objects``), run the job, say what came out."""
    from worker.jobs.bakeinputs import check_bake
    from worker.jobs.inputs import InputProblem, check_space, job_bytes, writing_to
    from worker.jobs.sceneinputs import check_scene

    try:
        bake = (check_scene(files, objects, settings, simplify_asked=asked) if args.scene
                else check_bake(files, settings, simplify_asked=asked))
    except InputProblem as e:
        raise CliError(str(e)) from None
    for note in bake.notes:
        print(note, file=sys.stderr)
    size = settings.bake.texture_size if settings.bake.texture_size != "auto" else 1024
    check_space([Path(settings.app.jobs_dir), out.parent], 2 * bake.input_bytes + job_bytes(0, size))
    with writing_to(out.parent):
        out.parent.mkdir(parents=True, exist_ok=True)
    runner = InProcessRunner(settings) if args.in_process else WorkerRunner(settings)
    progress = ProgressLine()
    t0 = time.perf_counter()
    try:
        startup = runner.start()
        result = runner.bake(bake, out, progress)
    finally:
        runner.close()
    total = time.perf_counter() - t0
    print(timing_table(result["timings"], total, {"worker start": startup, "queued": result["queued"]}),
          file=sys.stderr)
    stats = result["stats"]
    for line in summary_lines(stats.pipeline):
        print(line, file=sys.stderr)
    for w in stats.pipeline.warnings if stats.pipeline is not None else ():
        print(f"kiln: warning: {w}", file=sys.stderr)
    written = written_files(out, result, stats.pipeline)
    if args.report:
        write_report(args.report, {"timings": result["timings"], "total_s": total,
                                    "stats": stats.to_dict(), "glb": str(out.resolve()), "files": written})
    for f in written:
        print(f"wrote {f['path']} ({human_bytes(f['bytes'])})")
    for path in result.get("fit_files") or ():
        # the fitted camera: its silhouette over the photo to judge it by, and the camera itself
        # (a later bake takes it with --camera)
        print(f"wrote {Path(path).resolve()}")
    return 0


def _path(value):
    return Path(value) if value else None


def summary_lines(p) -> list[str]:
    """What a person baking a model reads after the table: what came out and from where."""
    if p is None:
        return []
    lines = [f"faces: {p.faces}, vertices: {p.vertices}"]
    if p.scene:
        return lines + [_object_line(o) for o in p.scene]
    m = p.model
    if m is not None:
        lines.append(f"uvs: {m.uvs}" + (f" (mirrored {m.uv_mirrored_fraction:.1%}, overlapping "
                                       f"{m.uv_overlap_fraction:.1%})" if m.uv_overlap_fraction is not None else ""))
        if m.frame:
            lines.append(f"splat frame: {m.frame} (surface distance {m.frame_surface_distance:.4f} of the mesh's size)")
        if m.silhouette:
            s = m.silhouette
            lines.append(f"camera ({m.camera}): silhouette {s['inside']:.0%} inside the mask, covers "
                         f"{s['coverage']:.0%} of it, IoU {s['iou']:.2f}")
        if m.photos and len(m.photos) > 1:
            lines += [_photo_line(n, photo) for n, photo in enumerate(m.photos, start=1)]
    if p.bake is not None and p.bake.texels_from:
        lines.append("texels from: " + ", ".join(f"{k} {v:.0%}" for k, v in p.bake.texels_from.items()))
    if p.bake is not None and p.bake.mirror is not None:
        mr = p.bake.mirror
        plane = mr.get("plane") or {}
        lines.append(f"mirror: {'used' if mr.get('used') else 'not used'}"
                     + (f", plane {plane.get('normal')} . x = {plane.get('offset')}, score {plane.get('score')}"
                        if plane else "")
                     + (f", {mr.get('texels_fraction', 0):.0%} of texels" if mr.get("used") else
                        f" ({mr.get('why_not', '')})"))
    return [textwrap.shorten(line, 200) for line in lines]


def _object_line(o) -> str:
    """One object of a scene (``kiln.records.SceneObjectStats``), as ``describe`` words it."""
    return textwrap.shorten(str(o.describe()), 200)


def _photo_line(n: int, photo) -> str:
    """One photo of several (``kiln.records.PhotoStats``), as ``PhotoStats.describe`` words it."""
    return str(photo.describe(n))

