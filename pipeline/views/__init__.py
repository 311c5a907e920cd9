"""Stage 2, render_views: the Gaussians rendered from views around the object."""
