"""What the page sends the browser besides its components: the stylesheet (progress bar,
history list, the hidden box-drag controls) and the drag-a-box script."""

CSS = """
#kiln-progress .kiln-bar { height: 14px; border-radius: 7px; background: var(--neutral-200); overflow: hidden; }
#kiln-progress .kiln-fill { height: 100%; background: var(--color-accent); transition: width .3s; }
#kiln-progress .kiln-fill.kiln-done { background: #2e9d4e; }
#kiln-progress .kiln-fill.kiln-failed, #kiln-progress .kiln-fill.kiln-cancelled { background: #c0392b; }
#kiln-progress .kiln-note { margin-top: 4px; font-size: 0.95em; }
#kiln-progress .kiln-note.kiln-refused, #kiln-bake-progress .kiln-note.kiln-refused { color: #a33; }
#kiln-canvas img { cursor: crosshair; user-select: none; -webkit-user-drag: none; }
.kiln-hidden { display: none !important; }
#kiln-box-drag { position: fixed; border: 2px dashed #ffd200; outline: 1px solid #000;
                 pointer-events: none; z-index: 1000; }
#kiln-status details summary { cursor: pointer; display: inline; font-size: 0.9em; }
#kiln-status details { display: inline; margin-left: .5em; }
#kiln-status details[open] { display: block; margin-left: 0; }
.kiln-history-list { list-style: none; padding: 0; margin: 0; }
.kiln-job { display: flex; gap: .6em; align-items: flex-start; margin: .35em 0; }
.kiln-thumb { width: 56px; height: 56px; object-fit: contain; flex: none; background: var(--neutral-100); }
.kiln-job.kiln-failed, .kiln-job.kiln-cancelled { color: #a33; }
/* the baking-only settings, switched off with baking: they look it, not just refuse input */
#kiln-texture:has(:disabled), #kiln-mode:has(:disabled), #kiln-views:has(:disabled) { opacity: .45; }
"""

# Dragging on the image draws a box (sent to the server through a hidden textbox and
# button); a plain click stays a click. Installed once per page by demo.load. A drag's own
# click event is swallowed, so Gradio's select does not add a point where the drag ended.
BOX_JS = """
() => {
  if (window.__kilnBox) return; window.__kilnBox = true;
  let start = null, suppress = false, rect = null;
  const MIN = 6;
  const target = (e) => e.target && e.target.closest ? e.target.closest('#kiln-canvas img') : null;
  const toPx = (img, cx, cy) => {
    const r = img.getBoundingClientRect(), nw = img.naturalWidth, nh = img.naturalHeight;
    const s = Math.min(r.width / nw, r.height / nh);
    const ox = r.left + (r.width - nw * s) / 2, oy = r.top + (r.height - nh * s) / 2;
    return [(cx - ox) / s, (cy - oy) / s];
  };
  const drawRect = (x0, y0, x1, y1) => {
    if (!rect) { rect = document.createElement('div'); rect.id = 'kiln-box-drag'; document.body.appendChild(rect); }
    Object.assign(rect.style, {left: Math.min(x0, x1) + 'px', top: Math.min(y0, y1) + 'px',
      width: Math.abs(x1 - x0) + 'px', height: Math.abs(y1 - y0) + 'px', display: 'block'});
  };
  const hideRect = () => { if (rect) rect.style.display = 'none'; };
  document.addEventListener('mousedown', (e) => {
    const img = target(e);
    if (!img || e.button !== 0) return;
    e.preventDefault();
    start = {img, x: e.clientX, y: e.clientY};
  }, true);
  document.addEventListener('mousemove', (e) => {
    if (!start) return;
    if (Math.hypot(e.clientX - start.x, e.clientY - start.y) < MIN) { hideRect(); return; }
    drawRect(start.x, start.y, e.clientX, e.clientY);
  }, true);
  document.addEventListener('mouseup', (e) => {
    if (!start) return;
    const s = start; start = null; hideRect();
    if (Math.hypot(e.clientX - s.x, e.clientY - s.y) < MIN) return;
    suppress = true; setTimeout(() => { suppress = false; }, 400);
    const [x0, y0] = toPx(s.img, s.x, s.y), [x1, y1] = toPx(s.img, e.clientX, e.clientY);
    const box = document.querySelector('#kiln-box-input textarea, #kiln-box-input input');
    const btn = document.querySelector('#kiln-box-btn');
    if (!box || !btn) return;
    const proto = box.tagName === 'TEXTAREA' ? HTMLTextAreaElement.prototype : HTMLInputElement.prototype;
    Object.getOwnPropertyDescriptor(proto, 'value').set.call(box,
      [x0, y0, x1, y1].map((v) => v.toFixed(1)).join(','));
    box.dispatchEvent(new Event('input', {bubbles: true}));
    setTimeout(() => btn.click(), 50);
  }, true);
  document.addEventListener('click', (e) => {
    if (suppress && target(e)) { suppress = false; e.stopPropagation(); e.preventDefault(); }
  }, true);
}
"""
