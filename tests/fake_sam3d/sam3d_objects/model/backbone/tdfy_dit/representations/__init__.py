"""Stand-ins for SAM 3D's TRELLIS-derived ``Gaussian`` and ``MeshExtractResult``.

The Gaussian stores raw parameters and exposes the activated getters with the
same activations and biases as the real class (exp scaling + bias + minimum
kernel, sigmoid opacity + bias, normalised rotation + identity bias, xyz in an
aabb), so the conversion under test reads exactly what it would read there.
"""

import torch


def _inverse_sigmoid(x):
    return torch.log(x / (1 - x))


class Gaussian:
    def __init__(self, aabb, sh_degree=0, mininum_kernel_size=0.0, scaling_bias=0.01,
                 opacity_bias=0.1, scaling_activation="exp", device="cpu"):
        self.sh_degree = sh_degree
        self.mininum_kernel_size = mininum_kernel_size
        self.aabb = torch.tensor(aabb, dtype=torch.float32)
        self.scale_bias = torch.log(torch.tensor(scaling_bias))
        self.rots_bias = torch.tensor([1.0, 0.0, 0.0, 0.0])
        self.opacity_bias = _inverse_sigmoid(torch.tensor(opacity_bias))
        self._xyz = self._features_dc = self._scaling = self._rotation = self._opacity = None
        self._features_rest = None

    @property
    def get_scaling(self):
        scales = torch.exp(self._scaling + self.scale_bias)
        return torch.sqrt(torch.square(scales) + self.mininum_kernel_size ** 2)

    @property
    def get_rotation(self):
        return torch.nn.functional.normalize(self._rotation + self.rots_bias[None, :])

    @property
    def get_xyz(self):
        return self._xyz * self.aabb[None, 3:] + self.aabb[None, :3]

    @property
    def get_features(self):
        return self._features_dc

    @property
    def get_opacity(self):
        return torch.sigmoid(self._opacity + self.opacity_bias)

    def from_scaling(self, scales):
        scales = torch.sqrt(torch.square(scales) - self.mininum_kernel_size ** 2)
        self._scaling = torch.log(scales) - self.scale_bias

    def from_rotation(self, rots):
        self._rotation = rots - self.rots_bias[None, :]

    def from_xyz(self, xyz):
        self._xyz = (xyz - self.aabb[None, :3]) / self.aabb[None, 3:]

    def from_features(self, features):
        self._features_dc = features

    def from_opacity(self, opacities):
        self._opacity = _inverse_sigmoid(opacities) - self.opacity_bias


class MeshExtractResult:
    def __init__(self, vertices, faces, vertex_attrs=None, res=64):
        self.vertices = vertices
        self.faces = faces.long()
        self.vertex_attrs = vertex_attrs
        self.res = res
        self.success = vertices.shape[0] != 0 and faces.shape[0] != 0
