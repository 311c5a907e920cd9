"""Stage 1, reconstruct: a photo and its mask into Gaussians and a mesh (the builtin
backend, SAM 3D Objects)."""
