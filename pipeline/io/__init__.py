"""Reading and writing other tools' files: meshes (GLB/glTF, OBJ, PLY, STL), Gaussian
splats in the INRIA 3DGS PLY layout, cameras, and the frames those tools use."""
