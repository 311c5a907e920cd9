"""The test process itself builds CUDA extensions (the in-process GPU tests of gsplat and
nvdiffrast), so it shares the extension cache and architecture list of Kiln's workers."""

from worker.child.env import share_extension_env

share_extension_env()
