"""What the page sends the browser besides its components: the stylesheet (progress bar,
history list, the hidden box-drag controls, drop zones that fit their text, the phone's
order) and two scripts: drag a box on the image, and replace the image by dropping a file
on the filled upload box."""

CSS = """
/* Gradio's theme draws semi-bold text (buttons, labels) in Source Sans Pro SemiBold, but the
   file it ships is a 5 kB subset with a couple of glyphs: Chromium drew "Download GLB" in
   DejaVu Sans Bold with its "B" from Source Sans, a letter of another shape. The last
   matching face wins, so weight 600 takes the complete Bold file Gradio also ships. */
@font-face { font-family: "Source Sans Pro"; src: url("static/fonts/SourceSansPro/SourceSansPro-Bold.woff2") format("woff2");
  font-weight: 600; font-style: normal; }
#kiln-progress .kiln-bar { height: 14px; border-radius: 7px; background: var(--neutral-200); overflow: hidden; }
#kiln-progress .kiln-fill { height: 100%; background: var(--color-accent); transition: width .3s; }
#kiln-progress .kiln-fill.kiln-done { background: #2e9d4e; }
/* done, but not all it was asked (a photo not projected): amber, and the note says what to change */
#kiln-progress .kiln-fill.kiln-warning, #kiln-bake-progress .kiln-fill.kiln-warning { background: #d88a00; }
#kiln-bake-progress [data-warning] .kiln-note, #kiln-bake-progress[data-warning] .kiln-note { color: #8a5a00; }
#kiln-progress .kiln-fill.kiln-failed, #kiln-progress .kiln-fill.kiln-cancelled { background: #c0392b; }
#kiln-progress .kiln-note { margin-top: 4px; font-size: 0.95em; }
#kiln-progress .kiln-note.kiln-refused, #kiln-bake-progress .kiln-note.kiln-refused { color: #a33; }
#kiln-canvas img { cursor: crosshair; user-select: none; -webkit-user-drag: none; }
.kiln-hidden { display: none !important; }
.kiln-range-note { color: var(--error-text-color, #b91c1c); font-size: var(--text-sm); }
.kiln-range-note:empty { display: none; }
#kiln-box-drag { position: fixed; border: 2px dashed #ffd200; outline: 1px solid #000;
                 pointer-events: none; z-index: 1000; }
#kiln-status details summary { cursor: pointer; display: inline; font-size: 0.9em; }
#kiln-status details { display: inline; margin-left: .5em; }
#kiln-status details[open] { display: block; margin-left: 0; }
.kiln-history-list { list-style: none; padding: 0; margin: 0; }
.kiln-job { display: flex; gap: .6em; align-items: flex-start; margin: .35em 0; }
.kiln-thumb { width: 56px; height: 56px; object-fit: contain; flex: none; background: var(--neutral-100); }
.kiln-job.kiln-failed, .kiln-job.kiln-cancelled { color: #a33; }
.kiln-job[data-pick] { cursor: pointer; border-radius: 6px; }
.kiln-job[data-pick]:hover, .kiln-job[data-pick]:focus { background: var(--neutral-100); outline: none; }
.kiln-job.kiln-shown { box-shadow: inset 3px 0 0 var(--color-accent); }
.kiln-job-id { opacity: .6; }
.kiln-history-hint { font-size: .9em; opacity: .8; margin-bottom: .3em; }
/* the baking-only settings, switched off with baking: they look it, not just refuse input */
#kiln-texture:has(:disabled), #kiln-mode:has(:disabled), #kiln-views:has(:disabled) { opacity: .45; }
/* File drop zones: Gradio floats the label over the drop zone, where it hides the upload
   icon (and, on two lines at 390 px, the text), and fixes the zone's height, which cuts
   "Click to Upload" off. The label takes its own line; the zone is as tall as its text. */
.kiln-drop label[data-testid="block-label"].float { position: static; max-width: calc(100% - 2 * var(--block-label-margin));
  margin-top: var(--block-label-margin); margin-left: var(--block-label-margin); }
.kiln-drop button.upload-container { height: auto !important; min-height: 64px; }
.kiln-drop [data-testid="upload-text"] { min-height: 0; padding: var(--size-2) 0; font-size: var(--text-md); }
.kiln-drop [data-testid="upload-icon"] { width: 22px; margin-bottom: var(--size-1); }
/* the fitted camera's picture: its label (the legend of the colours) is longer than the
   space Gradio leaves it beside the picture's icons (full screen, download, share), and ran
   under them; it takes its own lines, left of the icons */
#kiln-bake-fit-view label[data-testid="block-label"] { position: static; white-space: normal; height: auto;
  max-width: calc(100% - 96px); margin: var(--block-label-margin); overflow: visible; }
/* the upload box holding an image takes a drop or a click as a new image (REPLACE_JS) */
#kiln-upload:has(.file-preview-holder) .file-preview-holder { cursor: pointer; }
#kiln-upload:has(.file-preview-holder)::after { content: "Drop another image here, or click, to replace it";
  display: block; padding: 0 var(--size-3) var(--size-2); font-size: var(--text-sm);
  color: var(--body-text-color-subdued); }
#kiln-upload.kiln-drop-over { outline: 2px dashed var(--color-accent); outline-offset: -2px; }
/* the selection's check boxes wrap rather than squeeze their labels (Gradio lets them shrink
   to nothing, and clips) */
#kiln-view-options .form { flex-wrap: wrap; }
#kiln-view-options .block { min-width: max-content !important; flex: 1 1 0%; }
/* a laptop screen (1280x720, 1366x768): the result viewer shrinks so that it and its
   download stay on the first screen; 420 px from 860 px of height up */
@media (min-width: 768px) {
  #kiln-model, #kiln-bake-model { height: clamp(260px, calc(100vh - 440px), 420px) !important; }
}
/* a phone: one column in this order: the image and its selection, Generate and the result,
   the settings, then the mask file and the examples, then the history; the image box is
   no taller than the screen is wide. Before an image, the examples come first (below). */
@media (max-width: 767px) {
  #kiln-photo-row { flex-direction: column; flex-wrap: nowrap; }
  #kiln-image-col, #kiln-job-col { display: contents; }
  #kiln-settings { order: 1; }
  #kiln-image-more, #kiln-examples { order: 2; }
  #kiln-history-box { order: 3; }
  /* no image yet: the upload box, the line that says "pick an example below", then the
     examples, all on the first screen (they sat three screens down, under the settings) */
  #kiln-photo-row:not(:has(#kiln-canvas img)) :is(#kiln-upload, #kiln-mask-info, #kiln-examples) { order: -1; }
  #kiln-canvas { height: min(460px, 100vw) !important; }
}
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


# While the upload box holds an image Gradio shows the file, not a drop zone, and ignores a
# drop on it. This takes a file dropped there (or chosen after a click on it) and hands it
# to the hidden replace box, whose upload event replaces the image (handlers_image.on_replace).
# One event, so nothing races (clearing the box first would be a second event).
REPLACE_JS = """
() => {
  if (window.__kilnReplace) return; window.__kilnReplace = true;
  const filledBox = (e) => {
    const box = e.target && e.target.closest ? e.target.closest('#kiln-upload') : null;
    return box && box.querySelector('.file-preview-holder') && !box.querySelector('input[type=file]') ? box : null;
  };
  const replaceInput = () => document.querySelector('#kiln-upload-replace input[type=file]');
  const carriesFiles = (e) => e.dataTransfer && Array.from(e.dataTransfer.types || []).includes('Files');
  const replaceWith = (file) => {
    const input = replaceInput();
    if (!input || !file) return;
    const dt = new DataTransfer();
    dt.items.add(file);
    input.files = dt.files;
    input.dispatchEvent(new Event('change', {bubbles: true}));
  };
  document.addEventListener('dragover', (e) => {
    const box = filledBox(e);
    if (!box || !carriesFiles(e)) return;
    e.preventDefault(); e.stopPropagation();
    e.dataTransfer.dropEffect = 'copy';
    box.classList.add('kiln-drop-over');
  }, true);
  document.addEventListener('dragleave', (e) => {
    const box = filledBox(e);
    if (box && !box.contains(e.relatedTarget)) box.classList.remove('kiln-drop-over');
  }, true);
  document.addEventListener('drop', (e) => {
    const box = filledBox(e);
    if (!box) return;
    e.preventDefault(); e.stopPropagation();
    box.classList.remove('kiln-drop-over');
    const files = e.dataTransfer ? e.dataTransfer.files : null;
    if (files && files.length) replaceWith(files[0]);
  }, true);
  // a click on the box (not on its × or its download link) opens the file chooser
  document.addEventListener('click', (e) => {
    const box = filledBox(e);
    if (!box || e.target.closest('button, a')) return;
    const input = replaceInput();
    if (input) input.click();
  });
}
"""


# Gradio's sliders clamp a typed number to their range when the box loses focus, without a
# word: 1.5 in "Simplify ratio" silently became 0.999. This reads what was typed before the
# slider clamps it and says so under the slider until the next value in range.
RANGE_JS = """
() => {
  if (window.__kilnRange) return; window.__kilnRange = true;
  const note = (block) => {
    let el = block.querySelector(':scope > .kiln-range-note');
    if (!el) {
      el = document.createElement('div');
      el.className = 'kiln-range-note';
      el.setAttribute('role', 'status');
      block.appendChild(el);
    }
    return el;
  };
  const check = (e) => {
    const input = e.target;
    if (!input || input.type !== 'number' || !input.closest) return;
    const block = input.closest('.block');
    if (!block || !block.querySelector('input[type=range]')) return;   // sliders only
    const typed = Number(input.value), lo = Number(input.min), hi = Number(input.max);
    if (input.value === '' || !isFinite(typed) || input.min === '' || input.max === '') return;
    const label = ((block.querySelector('label span, label') || {}).innerText || 'This value').trim();
    const el = note(block);
    if (typed < lo || typed > hi) {
      const to = typed < lo ? lo : hi;
      el.innerText = `${label}: ${input.value} is outside ${lo} to ${hi}; it is set to ${to}.`;
    } else {
      el.innerText = '';
    }
  };
  document.addEventListener('change', check, true);
  document.addEventListener('blur', check, true);
}
"""


# A click (or Enter) on a done row of the history: its job id goes to the hidden
# ``history_pick`` box and the hidden button is pressed, as BOX_JS does for a box; the server
# checks the job is this browser's before it shows anything.
HISTORY_JS = """
() => {
  const pick = (row) => {
    const box = document.querySelector('#kiln-history-pick textarea, #kiln-history-pick input');
    const btn = document.querySelector('#kiln-history-btn');
    if (!box || !btn) return;
    document.querySelectorAll('.kiln-job.kiln-shown').forEach((r) => r.classList.remove('kiln-shown'));
    row.classList.add('kiln-shown');
    const proto = box.tagName === 'TEXTAREA' ? HTMLTextAreaElement.prototype : HTMLInputElement.prototype;
    Object.getOwnPropertyDescriptor(proto, 'value').set.call(box, row.dataset.job);
    box.dispatchEvent(new Event('input', {bubbles: true}));
    setTimeout(() => btn.click(), 50);
  };
  const row = (e) => e.target.closest && e.target.closest('#kiln-history .kiln-job[data-pick]');
  document.addEventListener('click', (e) => { const r = row(e); if (r) pick(r); });
  document.addEventListener('keydown', (e) => {
    const r = row(e);
    if (r && (e.key === 'Enter' || e.key === ' ')) { e.preventDefault(); pick(r); }
  });
}
"""
