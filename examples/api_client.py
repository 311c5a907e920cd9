"""Make a GLB from a photo through a running Kiln server's API (docs/api.md).

    python examples/api_client.py http://127.0.0.1:7860/ photo.png -o photo.glb
    python examples/api_client.py URL photo.jpg --mask mask.png --set bake=false --set views=8
    python examples/api_client.py URL photo.jpg --point 320,240 --auth USER:PASS
    python examples/api_client.py URL shot.jpg --mask auto    (the server finds the object)

Needs only gradio_client (pip install gradio_client). One Client is one session: the
upload, the job and the download below belong together, and no other client sees them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError


def setting_value(text: str):
    """'false' -> False, '8' -> 8, '0.9' -> 0.9, 'auto' -> 'auto'."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def make_glb(client: Client, image: str, out: str, mask: str | None = None,
             points: list | None = None, settings: dict | None = None) -> dict:
    """Upload ``image`` (with ``mask``, its alpha, or ``points`` to click; ``mask`` "auto":
    the server finds the object), generate with ``settings`` (generate's parameter names),
    save the GLB as ``out``; the job's last status."""
    auto = mask == "auto"
    info = client.predict(handle_file(image), handle_file(mask) if mask and not auto else None, True,
                          api_name="/upload_image")
    if points:
        info = client.predict([[x, y, 1] for x, y in points], None, api_name="/select")
    if auto:
        print(f"{info['image']}: {info['width']}x{info['height']}, the server finds the object")
    elif info["mask"] is None:
        raise SystemExit(f"{image}: no mask; give --mask (a file or auto), --point, or an image "
                         "with transparency")
    else:
        print(f"{info['image']}: {info['width']}x{info['height']}, mask from {info['mask']['source']} "
              f"({100 * info['mask']['share']:.1f}% of the image)")
        for warning in info["mask"]["warnings"]:
            print("warning:", warning)

    job = client.submit(**(settings or {}), **({"mask": "auto"} if auto else {}), api_name="/generate")
    shown = None
    for status, *_files in job:   # an update when the job changes, and every second
        line = f"  {status['state']:<8} {status['stage'] or '':<13} {100 * status['progress']:5.1f}%"
        if line != shown:
            print(line, flush=True)
            shown = line
    status, glb, ply, files = job.result()   # raises AppError with the reason if the job failed
    if "mask" in status:
        print(f"object found by {status['mask']['method']} ({100 * status['mask']['share']:.1f}% of the image)")
    shutil.copyfile(glb, out)
    print(f"job {status['job']} done in {status.get('total_s', 0):.1f} s -> {out}")
    for path in files or ():   # the other formats asked for (--set formats=obj,stl), by their own names
        other = Path(out).parent / Path(path).name
        shutil.copyfile(path, other)
        print(f"  and {other}")
    return status


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url", help="the server, e.g. http://127.0.0.1:7860/")
    p.add_argument("image")
    p.add_argument("-o", "--out", default="model.glb")
    p.add_argument("--mask", help="mask file of the image's size, or auto: the server finds the object")
    p.add_argument("--point", action="append", default=[], metavar="X,Y",
                   help="an object click in image pixels (repeatable), instead of a mask")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a generate parameter, e.g. bake=false, views=8, texture_size=auto")
    p.add_argument("--auth", metavar="USER:PASS", help="the server's login, if it has one")
    args = p.parse_args(argv)

    settings = {}
    for item in args.set:
        name, _, value = item.partition("=")
        settings[name] = setting_value(value)
    points = [tuple(float(v) for v in pt.split(",")) for pt in args.point]
    auth = tuple(args.auth.split(":", 1)) if args.auth else None
    client = Client(args.url, auth=auth, verbose=False)
    try:
        make_glb(client, args.image, args.out, args.mask, points, settings)
    except AppError as e:   # the server's reason: a refused input, a setting out of range, a failed job
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
