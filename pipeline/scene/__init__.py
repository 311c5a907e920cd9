"""Scenes: several objects from one photo, placed under its one camera, textured together
with a depth test across them (``placement``, ``occlusion``, ``scene_bake``)."""
