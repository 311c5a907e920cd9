// Renders a GLB from given cameras with three.js and returns the pixels.
//
// window.kilnRender({glb: url, background: [r, g, b] (0..255), mipmaps: bool, cameras: [{width,
//   height, projection: 16 numbers, view: 16 numbers}]}) -> [{rgb: PNG data URL, mask: PNG data URL}]
// Matrices are OpenGL's (camera looks along -z, y up), row-major; the caller builds them
// from OpenCV-style K / viewmat. Materials become unlit MeshBasicMaterial with the
// glTF's baseColor texture (or vertex colours) and no colour-space conversion anywhere,
// so an 8-bit texel reaches the canvas unchanged. "mask" is a second pass: the object
// white on black, the exact coverage of the colour pass.
import * as THREE from 'three';
import { GLTFLoader } from 'three/addons/loaders/GLTFLoader.js';

THREE.ColorManagement.enabled = false;

const canvas = document.createElement('canvas');
document.body.appendChild(canvas);
// antialias off: one sample per pixel centre, as the mask and the photo have
const renderer = new THREE.WebGLRenderer({canvas, antialias: false, alpha: false,
                                          preserveDrawingBuffer: true});
renderer.setPixelRatio(1);
renderer.outputColorSpace = THREE.LinearSRGBColorSpace;
renderer.toneMapping = THREE.NoToneMapping;

function unlit(scene, mipmaps) {
  const colour = new Map();
  const cover = new Map();
  scene.traverse((obj) => {
    if (!obj.isMesh) return;
    obj.frustumCulled = false;
    const src = obj.material;
    const map = src.map || null;
    if (map) {
      map.colorSpace = THREE.NoColorSpace;
      if (!mipmaps) {   // diagnostic: plain bilinear, as Kiln's own renderer samples
        map.generateMipmaps = false;
        map.minFilter = THREE.LinearFilter;
      }
      map.needsUpdate = true;
    }
    colour.set(obj, new THREE.MeshBasicMaterial({
      map, color: src.color ? src.color.clone() : new THREE.Color(1, 1, 1),
      vertexColors: !!src.vertexColors, side: src.side, transparent: false}));
    cover.set(obj, new THREE.MeshBasicMaterial({color: 0xffffff, side: src.side}));
  });
  return {colour, cover};
}

function setMaterials(table) {
  for (const [obj, mat] of table) obj.material = mat;
}

function makeCamera(spec) {
  const cam = new THREE.Camera();
  cam.projectionMatrix.set(...spec.projection);
  cam.projectionMatrixInverse.copy(cam.projectionMatrix).invert();
  const view = new THREE.Matrix4().set(...spec.view);
  cam.matrixAutoUpdate = false;
  cam.matrix.copy(view).invert();
  cam.matrixWorldNeedsUpdate = true;
  cam.updateMatrixWorld(true);
  return cam;
}

window.kilnRender = async function (request) {
  const gltf = await new GLTFLoader().loadAsync(request.glb);
  const scene = gltf.scene;
  scene.updateMatrixWorld(true);
  // default: what GLTFLoader and so most viewers do (trilinear mipmaps unless the glTF says otherwise)
  const mats = unlit(scene, request.mipmaps !== false);
  const bg = new THREE.Color(request.background[0] / 255, request.background[1] / 255,
                             request.background[2] / 255);
  const out = [];
  for (const spec of request.cameras) {
    renderer.setSize(spec.width, spec.height, false);
    const cam = makeCamera(spec);
    setMaterials(mats.colour);
    renderer.setClearColor(bg, 1);
    renderer.render(scene, cam);
    const rgb = canvas.toDataURL('image/png');
    setMaterials(mats.cover);
    renderer.setClearColor(0x000000, 1);
    renderer.render(scene, cam);
    const mask = canvas.toDataURL('image/png');
    out.push({rgb, mask});
  }
  return out;
};
window.kilnReady = true;
